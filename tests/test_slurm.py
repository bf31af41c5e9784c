"""A sweep through `hydra/launcher=ragrig_slurm` on a real Slurm cluster: slurmctld, slurmd and munged
from Debian's packages on 127.0.0.1 (tests/slurm_cluster.py), each job of the sweep a task of a
Slurm job array that runs the project's code in its own process, all of them sharing the artifact
cache, and the summary written by the submitting process once every job has finished.
`make test-distributed` installs the packages (as root) and runs this file.
"""
from __future__ import annotations

import re
import subprocess

import pytest

from tests.slurm_cluster import SlurmCluster, missing
from tests.test_distributed import assert_grid_sweep, grid_args
from tests.test_sweeps import ENV, multirun, tiny  # noqa: F401 (tiny: the sweeps' corpus fixture)

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def test_the_cluster_has_one_idle_node_with_the_machines_cpus(slurm):
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %c"], env=slurm.env, capture_output=True, text=True)
    assert done.stdout.split() == [slurm.host, "idle", str(slurm.cpus)], done.stderr


def test_a_sweep_runs_as_a_slurm_job_array_and_shares_the_cache(slurm, tiny, tmp_path):  # noqa: F811
    cache, sweep = tmp_path / "cache", tmp_path / "slurm-sweep"
    launcher = ["hydra/launcher=ragrig_slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1",
                "hydra.launcher.mem_gb=4", "hydra.launcher.timeout_min=20", "hydra.launcher.array_parallelism=2"]
    done = multirun(grid_args(tiny, cache) + launcher, sweep, env={**ENV, **slurm.env})
    assert "Submitit 'slurm' sweep output dir" in done.stdout + done.stderr, done.stderr[-2000:]
    # one array job of 4 tasks, each its own process on the node, each with a result file
    submitted = sorted((sweep / ".submitit").glob("*/*_submission.sh"))
    assert submitted and "#SBATCH --array=0-3%2" in submitted[0].read_text()
    logs = sorted((sweep / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 4 and len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 4
    job_ids = {re.search(r"(\d+)_\d+", p.parent.name).group(1) for p in logs}
    assert len(job_ids) == 1, job_ids
    assert_grid_sweep(sweep, cache)
    # Slurm ran them: the controller logged each array task's completion with exit status 0
    log = (slurm.root / "log" / "slurmctld.log").read_text()
    job = job_ids.pop()
    for task in range(4):
        assert re.search(rf"_job_complete: JobId={job}_{task}\(\d+\) WEXITSTATUS 0", log), slurm.logs()
