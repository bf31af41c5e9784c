"""A one-node Slurm cluster on 127.0.0.1 for tests: munged, slurmctld and slurmd from Debian's
`slurm-wlm` and `munge` (`make test-distributed` installs them), each with its configuration,
state and logs under one scratch directory, so nothing in /etc/slurm is read or written.

Clients (sbatch, squeue, scancel: what submitit calls) find the cluster through SLURM_CONF in the
environment `SlurmCluster.env` gives. There is no accounting database: submitit's `sacct` calls
fail and it falls back on the result files the jobs write, which is how it sees a job finish.
The node runs jobs as root with no cgroup plugins (containers rarely delegate cgroups).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin")


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    for name in (*DAEMONS, "sbatch", "squeue", "sinfo"):
        if shutil.which(name, path=os.pathsep.join([*SBIN, os.environ.get("PATH", "")])) is None:
            return f"{name} not found: apt-get install slurm-wlm munge (make test-distributed does, as root)"
    if os.geteuid() != 0:
        return "a test Slurm node runs its jobs as root: run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, root: Path, cpus: int = 2):
        self.root = Path(root)
        self.cpus = cpus
        self.procs: list[subprocess.Popen] = []
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), "MUNGE_SOCKET": str(self.munge_socket),
                "PATH": os.pathsep.join([os.environ.get("PATH", ""), *SBIN])}

    def _write_config(self) -> None:
        for d in ("state", "spool", "log", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        mem_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        self.conf.write_text("\n".join([
            "ClusterName=ragrig-test",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",  # the daemons and clients find munged here
            "CryptoType=crypto/munge",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "ReturnToService=2",
            "MpiDefault=none",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "MinJobAge=60",
            "KillWait=5",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={mem_mb} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def start(self, timeout: float = 60) -> "SlurmCluster":
        self._write_config()
        env = self.env
        munge = self.root / "munge"
        # munged with its own socket, pid and log; the key is the package's (/etc/munge/munge.key)
        self.procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={self.munge_socket}", f"--pid-file={munge / 'munged.pid'}",
             f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged did not create its socket")
        for daemon in ("slurmctld", "slurmd"):
            self.procs.append(subprocess.Popen([daemon, "-D", "-f", str(self.conf)], env=env,
                                               stdout=open(self.root / "log" / f"{daemon}.out", "w"),
                                               stderr=subprocess.STDOUT))
        self._wait(self._node_idle, timeout, "the node did not become idle")
        return self

    def _node_idle(self) -> bool:
        if any(p.poll() is not None for p in self.procs):
            raise RuntimeError(f"a Slurm daemon exited: {self.logs()}")
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True)
        return done.returncode == 0 and done.stdout.strip() == "idle"

    @staticmethod
    def _wait(ready, timeout: float, what: str) -> None:  # noqa: ANN001
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(what)

    def logs(self) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            if f.is_file():
                parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True)
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()
