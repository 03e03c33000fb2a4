"""A serving replica writes only where the operator's pods mount something writable (read-only root filesystem):
the replica runs with the cache variables the builders give the engine container (HOME and the caches under
it, moved to a temporary folder) and an audit hook in every Python process (sitecustomize: `open` for writing,
`os.mkdir`, `os.rename`, `os.replace`) records each write outside HOME, /tmp and the kernel's /dev and /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from llmfleet.operator.builders import build_inferenceservice
from llmfleet.operator.builders.security import CACHE_ENV, HOME_DIR
from llmfleet.operator.config import OperatorConfig
from llmfleet.util.net import free_port

from .conftest import stop, tiny_service, wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

AUDIT = textwrap.dedent('''
    import os, sys
    _LOG = os.environ["LLMFLEET_WRITE_AUDIT"]
    _OK = tuple(os.environ["LLMFLEET_WRITABLE"].split(os.pathsep))
    _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT
    _busy = False

    def _hook(event, args):
        global _busy
        if _busy:
            return
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE)
        elif event == "os.mkdir":
            path, writing = args[0], True
        elif event in ("os.rename", "os.replace"):
            path, writing = args[1], True
        else:
            return
        if not writing or path is None or isinstance(path, int):
            return
        where = os.path.abspath(os.fsdecode(path))
        if where.startswith(_OK):
            return
        _busy = True
        try:
            with open(_LOG, "a") as fh:
                fh.write(f"{os.getpid()} {event} {where}\\n")
        finally:
            _busy = False

    sys.addaudithook(_hook)
''')


def test_the_replica_writes_only_to_its_mounted_folders(tiny_primary: Path, tmp_path: Path) -> None:
    isvc = tiny_service(str(tiny_primary))
    isvc.metadata.uid = "uid-1"
    deployment = next(m for m in build_inferenceservice(isvc, OperatorConfig()) if m["kind"] == "Deployment"
                      and m["metadata"]["name"] == "tiny-primary")
    (engine,) = deployment["spec"]["template"]["spec"]["containers"]
    pod_env = {e["name"]: e["value"] for e in engine["env"] if e["name"] in CACHE_ENV}
    assert pod_env == CACHE_ENV
    home = tmp_path / "home"
    home.mkdir()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(AUDIT)
    audit = tmp_path / "writes.log"
    writable = [str(home), "/tmp", "/dev/", "/proc/"]
    env = {
        **os.environ,
        **{k: v.replace(HOME_DIR, str(home)) for k, v in pod_env.items()},
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "PYTHONDONTWRITEBYTECODE": "1",  # as in the images
        "LLMFLEET_WRITE_AUDIT": str(audit),
        "LLMFLEET_WRITABLE": os.pathsep.join(writable),
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_NO_USAGE_STATS": "1",
    }
    # The hook sees writes (the audit event comes before the system call, so a path that cannot exist does).
    probe = "import os\ntry:\n    os.mkdir('/nonexistent-llmfleet-probe/x')\nexcept OSError:\n    pass\n"
    subprocess.run([sys.executable, "-c", probe], env=env, check=True, timeout=60)
    assert audit.read_text().split()[1:] == ["os.mkdir", "/nonexistent-llmfleet-probe/x"]
    audit.unlink()
    from llmfleet.workers.serve.vllm_args import serve_command

    port = free_port()
    cmd = serve_command(isvc, isvc.pools()[0], port=port, host="127.0.0.1", python=sys.executable,
                        kv_events_port=free_port())
    log = tmp_path / "replica.log"
    with open(log, "wb") as fh:
        # The working directory of the images (WORKDIR) is HOME.
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=home, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        resp = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "def main():", "max_tokens": 8},
                          timeout=120)
        assert resp.status_code == 200, resp.text
    finally:
        stop(proc)
    outside = audit.read_text().splitlines() if audit.exists() else []
    assert outside == [], "\n".join(outside[:40])
