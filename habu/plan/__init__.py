"""The plan layer: how a model is computed (kernels, their schedules, fusion regions, algebraic
rewrites). It sits above the spec and below the lowering, the proofs and the emitters, which read it."""
