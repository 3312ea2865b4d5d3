"""Deployments on disk: one SQLite table, so they survive a controller restart, each with the
version of its model it serves (`Manifest.digest`): a deployment restored after a restart
says whether its model was replaced while no controller ran (`policy.versions.decide_restore`;
docs/control.md, Versions). A file written before versions were recorded is migrated in place
(its deployments read without a version, one WARNING)."""

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path

from surge.control.spec import DeploymentSpec
from surge.errors import SurgeError
from surge.policy.versions import decide_restore

log = logging.getLogger(__name__)


class DeploymentStore:
    """name -> spec (JSON) and digest, in `state_dir/deployments.sqlite`."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS deployments ("
                "name TEXT PRIMARY KEY, spec TEXT NOT NULL, created REAL NOT NULL, "
                "digest TEXT NOT NULL DEFAULT '')"
            )
            self._migrate(path)
            self._db.commit()
        except sqlite3.Error as e:
            raise SurgeError(f"cannot open the deployment database {path}: {e}") from None

    def _migrate(self, path: Path) -> None:
        """A table from before versions were recorded gains its `digest` column (empty)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(deployments)")}
        if "digest" in columns:
            return
        self._db.execute("ALTER TABLE deployments ADD COLUMN digest TEXT NOT NULL DEFAULT ''")
        (count,) = self._db.execute("SELECT COUNT(*) FROM deployments").fetchone()
        log.warning(
            "%s was written before deployments recorded their model's version: %d read without "
            "it; each records the version its model store holds when it is restored",
            path, count,
        )  # fmt: skip

    def add(self, spec: DeploymentSpec) -> None:
        """A new deployment; its version is recorded once its store is read (`record_digest`)."""
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO deployments (name, spec, created) VALUES (?, ?, ?)",
                    (spec.name, json.dumps(spec.to_json()), time.time()),
                )
                self._db.commit()
            except sqlite3.IntegrityError:
                raise SurgeError(f"deployment {spec.name!r} already exists") from None

    def record_digest(self, name: str, digest: str) -> None:
        """The version of its model deployment `name` serves (its store's manifest's)."""
        with self._lock:
            self._db.execute("UPDATE deployments SET digest = ? WHERE name = ?", (digest, name))
            self._db.commit()

    def digest(self, name: str) -> str:
        """The version deployment `name` recorded ("": none, or no such deployment)."""
        with self._lock:
            row = self._db.execute(
                "SELECT digest FROM deployments WHERE name = ?", (name,)
            ).fetchone()
        return row[0] if row else ""

    def restored(self, name: str, current: str) -> None:
        """Deployment `name` comes back after a restart serving version `current` (its model
        store's now): one WARNING if it recorded another (the model was replaced while no
        controller ran; `policy.versions.decide_restore`), then `current` is recorded."""
        decision = decide_restore(name, self.digest(name), current)
        if decision.warning:
            log.warning("%s", decision.warning)
        self.record_digest(name, decision.digest)

    def remove(self, name: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM deployments WHERE name = ?", (name,))
            self._db.commit()
            return cur.rowcount > 0

    def all(self) -> list[DeploymentSpec]:
        with self._lock:
            rows = self._db.execute("SELECT spec FROM deployments ORDER BY created").fetchall()
        return [DeploymentSpec.from_json(json.loads(r[0])) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
