"""Deployments on disk: one SQLite table, so they survive a controller restart."""

import json
import sqlite3
import threading
import time
from pathlib import Path

from surge.control.spec import DeploymentSpec
from surge.errors import SurgeError


class DeploymentStore:
    """name -> spec (JSON), in `state_dir/deployments.sqlite`."""

    def __init__(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS deployments ("
                "name TEXT PRIMARY KEY, spec TEXT NOT NULL, created REAL NOT NULL)"
            )
            self._db.commit()
        except sqlite3.Error as e:
            raise SurgeError(f"cannot open the deployment database {path}: {e}") from None

    def add(self, spec: DeploymentSpec) -> None:
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO deployments (name, spec, created) VALUES (?, ?, ?)",
                    (spec.name, json.dumps(spec.to_json()), time.time()),
                )
                self._db.commit()
            except sqlite3.IntegrityError:
                raise SurgeError(f"deployment {spec.name!r} already exists") from None

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
