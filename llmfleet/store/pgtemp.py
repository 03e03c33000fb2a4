"""A throwaway PostgreSQL server (initdb + pg_ctl from Debian's postgresql) for tests and benchmarks.

PostgreSQL refuses to run as root, so under root the data folder is handed to `nobody` and the server runs
as that user. It listens on 127.0.0.1 on a free port, with its socket in its own folder, and `stop()`
removes everything.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from llmfleet.util.net import free_port


class PostgresUnavailableError(RuntimeError):
    pass


def find_bin_dir() -> Path | None:
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]), reverse=True)
    for d in dirs:
        if os.path.exists(os.path.join(d, "initdb")):
            return Path(d)
    return None


class TempPostgres:
    def __init__(self, *, fsync: bool = False, extra_conf: dict[str, str] | None = None) -> None:
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise PostgresUnavailableError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="llmfleet-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self.fsync = fsync
        self.extra_conf = extra_conf or {}
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "nobody"
            shutil.chown(self.root, user="nobody", group="nogroup")
            os.chmod(self.root, 0o700)

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), user=self._user, cwd=self.root, capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"},
        )

    def start(self) -> TempPostgres:
        if not self.data.exists():
            r = self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                          "-E", "UTF8", "--no-sync")
            if r.returncode:
                raise PostgresUnavailableError(f"initdb failed: {r.stderr.strip()[-500:]}")
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
            "fsync": "on" if self.fsync else "off",
            "synchronous_commit": "on" if self.fsync else "off",
            "full_page_writes": "on" if self.fsync else "off",
            "max_connections": "100",
            **self.extra_conf,
        }
        with (self.data / "postgresql.auto.conf").open("a") as f:
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        for attempt in range(3):
            self.port = free_port()
            r = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
                          "-o", f"-p {self.port}", "-w", "-t", "60", "start")
            if r.returncode == 0:
                return self
            if attempt == 2:
                log = (self.root / "log").read_text()[-1000:] if (self.root / "log").exists() else ""
                raise PostgresUnavailableError(f"pg_ctl start failed: {r.stderr.strip()[-300:]} {log}")
            time.sleep(0.2)
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def restart(self) -> None:
        r = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
                      "-o", f"-p {self.port}", "-w", "-t", "60", "start")
        if r.returncode:
            raise PostgresUnavailableError(f"pg_ctl start failed: {r.stderr.strip()[-300:]}")

    def cleanup(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def __enter__(self) -> TempPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
