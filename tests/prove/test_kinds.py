"""Every kernel kind registers its part of the finite-field check (habu/prove/kinds.py) and its launch
geometry (habu/emit_cuda/geometry.py); the layers above the lowering look kinds up there."""

from __future__ import annotations

import typing

import pytest

from habu.emit_cuda.emit_stage import STAGE_GRID
from habu.emit_cuda.geometry import FLAT_GRID, GRID_2D, geometry_for
from habu.lower import ColumnLowering, GeneralLowering, Lowering, MapLowering
from habu.lower.staging import StageLowering
from habu.prove.kinds import kind_proof


def test_every_lowering_kind_has_a_finite_field_check_and_a_launch_geometry() -> None:
    kinds = typing.get_args(Lowering)
    assert len(kinds) == 8  # contraction, rows, map, general, columns, grouped, grouped weight gradient, attention
    for kind in kinds:
        lw = object.__new__(kind)  # the lookup reads only the type
        assert kind_proof(lw).run is not None
        assert geometry_for(lw).blocks is not None
    assert geometry_for(object.__new__(StageLowering)) is STAGE_GRID
    assert geometry_for(object.__new__(ColumnLowering)) is GRID_2D
    assert geometry_for(object.__new__(MapLowering)) is FLAT_GRID
    assert geometry_for(object.__new__(GeneralLowering)) is FLAT_GRID


def test_a_subclass_of_a_lowering_is_its_base_kind() -> None:
    class PlantedMap(MapLowering):  # as the mutants of habu/bench/mutants.py subclass lowerings
        pass

    lw = object.__new__(PlantedMap)
    assert kind_proof(lw) is kind_proof(object.__new__(MapLowering))
    assert geometry_for(lw) is FLAT_GRID


def test_an_unregistered_kind_is_named() -> None:
    class Unknown:
        pass

    with pytest.raises(TypeError, match="no finite-field check is registered for Unknown"):
        kind_proof(Unknown())
    with pytest.raises(TypeError, match="no launch geometry is registered for Unknown"):
        geometry_for(Unknown())
