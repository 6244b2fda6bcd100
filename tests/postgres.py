"""A throwaway PostgreSQL cluster for the tests: Debian's `postgresql` package (installed with apt-get when
missing, as the browser tests install Chromium), `initdb` and `pg_ctl` in a temporary directory, listening on a
loopback port with password authentication, removed afterwards.

`initdb` refuses to run as root, so as root the cluster belongs to the `postgres` user (the package creates it)
and its commands run through `runuser`.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from tests.support import apt_install, free_port

USER = "dragon"


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def install() -> Path:
    """The directory of initdb and pg_ctl, installing Debian's postgresql package when it is missing."""
    found = _bin_dir()
    if found is None:
        problem = apt_install("postgresql")
        found = _bin_dir()
        if found is None:
            raise RuntimeError(
                f"cannot install postgresql: {problem or 'installed, but no pg_ctl in /usr/lib/postgresql'}"
            )
    return found


class PostgresServer:
    """One cluster on 127.0.0.1:<port>; `url(db)` connects as a password-protected user that owns `db`."""

    def __init__(self, root: Path | None = None):
        self.bin = install()
        self.owner = "postgres" if os.geteuid() == 0 else None
        self.root = Path(root or tempfile.mkdtemp(prefix="dragon-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.password = secrets.token_urlsafe(12)
        self.host = "127.0.0.1"
        self.sockets.mkdir(parents=True, exist_ok=True)
        if self.owner:
            shutil.chown(self.root, self.owner)
            shutil.chown(self.sockets, self.owner)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.owner:
            shutil.chown(pwfile, self.owner)
        # the superuser is `dragon` with a password over TCP (scram), trusted on the cluster's own socket only
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        pwfile.unlink()
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.sockets}'\n"
                "fsync = on\nmax_connections = 200\n"
            )
        self.start()

    def _run(self, tool: str, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        command = [str(self.bin / tool), *args]
        if self.owner:
            command = ["runuser", "-u", self.owner, "--", *command]
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            log = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed (rc {done.returncode}): {done.stdout}\n{done.stderr}\n{log}")
        return done

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: 'fast' ends open sessions; 'immediate' is a crash (no checkpoint, recovery on start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False)

    def restart(self, down_s: float = 0.0, mode: str = "fast") -> None:
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # ----------------------------------------------------------------------------------------- databases

    def url(self, database: str = "postgres", password: str | None = None, driver: str = "postgresql") -> str:
        secret = self.password if password is None else password
        return f"{driver}://{USER}:{quote(secret, safe='')}@{self.host}:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement through psql on the cluster's socket; its output."""
        done = self._run(
            "psql", "-h", str(self.sockets), "-p", str(self.port), "-U", USER, "-d", database, "-Atc", statement
        )
        return done.stdout.strip()

    def script(self, text: str, stdin: str = "") -> str:
        """Run an SQL script as the superuser, as `psql -v ON_ERROR_STOP=1 -f FILE` does (the first error stops it,
        and its \\prompt commands read stdin, one line each); its output. The file lies in the cluster's folder,
        which the cluster's user can read."""
        path = self.root / f"script-{secrets.token_hex(4)}.sql"
        path.write_text(text)
        if self.owner:
            shutil.chown(path, self.owner)
        try:
            return self._run(
                "psql",
                "-h",
                str(self.sockets),
                "-p",
                str(self.port),
                "-U",
                USER,
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-f",
                str(path),
                stdin=stdin,
            ).stdout
        finally:
            path.unlink()

    def dump(self, database: str) -> str:
        """The database's rows as pg_dump writes them (SQL text), to search for what must not be stored."""
        return self._run(
            "pg_dump", "-h", str(self.sockets), "-p", str(self.port), "-U", USER, "--data-only", database
        ).stdout

    def create_database(self, name: str | None = None) -> str:
        """A new empty database (a unique name unless given); its URL."""
        name = name or f"db_{secrets.token_hex(4)}"
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)
