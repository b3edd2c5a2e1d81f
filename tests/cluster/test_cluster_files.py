"""cluster/: the scripts, the rendered launcher config and KubeRay manifest, and the README's
recipe followed for real (a head started by the script, `habu search --ray ADDRESS`)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

yaml = pytest.importorskip("yaml")
CLUSTER = ROOT / "cluster"


def render_module():
    spec = importlib.util.spec_from_file_location("habu_cluster_render", CLUSTER / "render.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rendered(tmp_path: Path, **env: str) -> tuple[dict, dict]:
    r = subprocess.run([sys.executable, str(CLUSTER / "render.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, env=dict(os.environ, **env), timeout=60)
    assert r.returncode == 0, r.stderr
    aws = yaml.safe_load((tmp_path / "ray-cluster-aws.yaml").read_text())
    kube = yaml.safe_load((tmp_path / "kuberay-raycluster.yaml").read_text())
    return aws, kube


def test_every_template_setting_comes_from_config_env(tmp_path):
    aws, kube = rendered(tmp_path)
    settings = render_module().read_config(CLUSTER / "config.env", {})
    store = settings["HABU_RAY_OBJECT_STORE_BYTES"]
    # the launcher: a GPU worker type, the ports and object store of config.env
    assert aws["available_node_types"]["gpu_worker"]["node_config"]["InstanceType"] == settings["HABU_GPU_INSTANCE"]
    assert f"--port={settings['HABU_RAY_PORT']}" in aws["head_start_ray_commands"][1]
    assert f"--object-store-memory={store}" in aws["worker_start_ray_commands"][1]
    assert "$RAY_HEAD_IP" in aws["worker_start_ray_commands"][1]  # left for the launcher to fill
    # KubeRay: GPU workers ask Kubernetes for the GPUs Ray is told about
    (group,) = kube["spec"]["workerGroupSpecs"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == group["rayStartParams"]["num-gpus"] == settings["HABU_K8S_GPUS_PER_POD"]
    assert kube["kind"] == "RayCluster" and kube["spec"]["rayVersion"] == settings["HABU_RAY_VERSION"]
    ports = {p["name"]: p["containerPort"] for p in
             kube["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports["gcs"] == int(settings["HABU_RAY_PORT"])


def test_a_setting_is_overridden_from_the_environment(tmp_path):
    aws, kube = rendered(tmp_path, HABU_GPU_WORKERS_MAX="7", HABU_K8S_GPUS_PER_POD="4")
    assert aws["max_workers"] == 7 and aws["available_node_types"]["gpu_worker"]["max_workers"] == 7
    assert kube["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] == "4"


def test_a_bad_config_line_is_reported_with_its_place(tmp_path):
    bad = tmp_path / "config.env"
    bad.write_text("HABU_RAY_PORT=${HABU_RAY_PORT:-6379}\nHABU_OOPS = 3\n")
    r = subprocess.run([sys.executable, str(CLUSTER / "render.py"), "--config", str(bad), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"{bad}:2:1: error: expected NAME=" in r.stderr and "Traceback" not in r.stderr


def test_the_scripts_use_config_env(tmp_path):
    head = subprocess.run(["bash", str(CLUSTER / "start-head.sh"), "--dry-run"], capture_output=True, text=True,
                          env=dict(os.environ, HABU_RAY_PORT="7123", HABU_RAY_NUM_CPUS="3"), timeout=30)
    assert head.returncode == 0 and head.stdout.startswith("ray start --head --port=7123 ")
    assert "--num-cpus=3" in head.stdout and "--object-store-memory=4000000000" in head.stdout
    worker = subprocess.run(["bash", str(CLUSTER / "start-worker.sh"), "10.1.2.3:7123", "--dry-run"],
                            capture_output=True, text=True, timeout=30)
    assert worker.returncode == 0 and worker.stdout.startswith("ray start --address=10.1.2.3:7123 ")
    usage = subprocess.run(["bash", str(CLUSTER / "start-worker.sh")], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "usage:" in usage.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_recipe_a_head_from_the_script_and_habu_search_ray_address(tmp_path):
    pytest.importorskip("ray")
    port = _free_port()
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""), RAY_AUTH_MODE="disabled",
               HABU_RAY_PORT=str(port), HABU_RAY_DASHBOARD_PORT=str(_free_port()),
               HABU_RAY_NUM_CPUS="2",
               HABU_RAY_OBJECT_STORE_BYTES=str(200 << 20), HABU_DB=str(tmp_path / "db.sqlite"))
    up = subprocess.run(["bash", str(CLUSTER / "start-head.sh")], capture_output=True, text=True, env=env,
                        timeout=180)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        assert "cluster/start-worker.sh" in up.stdout
        r = subprocess.run([sys.executable, "-m", "habu", "search", str(ROOT / "examples" / "ggemm.habu"),
                            "--shape", "M=512,N=512,K=384", "--budget", "4", "--ray", f"127.0.0.1:{port}",
                            "-o", str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        said = r.stdout + r.stderr  # results go to stdout, progress to stderr
        assert "Ray cluster: 1 node(s), 2 CPUs" in said and "ray)" in said
    finally:
        subprocess.run(["bash", str(CLUSTER / "stop.sh")], capture_output=True, env=env, timeout=120)
