"""The controller's state records which version of its model each deployment serves
(docs/control.md, Versions; `control/store.py`, `policy.versions.decide_restore`):
- a deployment records its store's digest when it is created; a controller restarted after
  the model was replaced (imported again over the same store while no controller ran) says
  so in one WARNING naming both versions, serves the new version (token-exact against a
  local engine of it; the old version's copies on the agents dropped) and records it. Before:
  the state had no version, the restart said nothing about the replacement;
- a state file written before versions were recorded is migrated in place with one WARNING
  (its deployments read without a version; restored, they record their store's, no
  "replaced" warning: nothing says what they served)."""

import asyncio
import json
import logging
import shutil
import sqlite3

import pytest

from surge.control.controller import Controller, ControllerConfig
from surge.control.spec import DeploymentSpec
from surge.control.store import DeploymentStore
from surge.engine.sampling import SamplingParams
from surge.model.tokenizer import load_tokenizer
from tests.control.conftest import Reference
from tests.control.strategy_run import local_cluster
from tests.control.test_serve_openai import MODEL
from tests.control.test_versions import second_version

V1 = "sha256:" + "1" * 64
V2 = "sha256:" + "2" * 64
SPEC = {"name": "m", "model": "/models/m"}
STORE_LOGGER = "surge.control.store"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _recorded(state) -> str:
    """The version the state records for MODEL (read as the next controller would)."""
    store = DeploymentStore(state / "deployments.sqlite")
    try:
        return store.digest(MODEL)
    finally:
        store.close()


def test_an_old_state_file_is_migrated_with_one_warning(tmp_path, caplog) -> None:
    path = tmp_path / "deployments.sqlite"
    db = sqlite3.connect(path)  # the table as controllers before versions wrote it
    db.execute(
        "CREATE TABLE deployments ("
        "name TEXT PRIMARY KEY, spec TEXT NOT NULL, created REAL NOT NULL)"
    )
    spec = DeploymentSpec.from_json(SPEC)
    db.execute("INSERT INTO deployments VALUES (?, ?, ?)", ("m", json.dumps(spec.to_json()), 1.0))
    db.commit()
    db.close()
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        store = DeploymentStore(path)
    [warning] = _warnings(caplog)
    assert "written before deployments recorded their model's version: 1 read without" in warning
    assert store.all() == [spec] and store.digest("m") == ""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        store.restored("m", V1)  # nothing says what it served: no "replaced"
    assert _warnings(caplog) == [] and store.digest("m") == V1
    store.close()
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        again = DeploymentStore(path)  # migrated: no second warning
    assert _warnings(caplog) == [] and again.digest("m") == V1
    again.close()


def test_a_restore_at_another_version_warns_once_and_records_it(tmp_path, caplog) -> None:
    store = DeploymentStore(tmp_path / "deployments.sqlite")
    store.add(DeploymentSpec.from_json(SPEC))
    store.record_digest("m", V1)
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        store.restored("m", V1)
        assert _warnings(caplog) == []
        store.restored("m", V2)
    [warning] = _warnings(caplog)
    assert warning == (
        f"deployment 'm' served version {V1[:19]} before the restart; its model store holds "
        f"version {V2[:19]} now (replaced while no controller ran): serving {V2[:19]}, the "
        f"agents' copies of {V1[:19]} dropped"
    )
    assert store.digest("m") == V2
    store.close()


@pytest.mark.timeout(300)
def test_a_model_replaced_while_no_controller_ran_is_said_and_served(
    tmp_path, tiny_store_dir, caplog
) -> None:
    model = tmp_path / "model"  # the deployment's store: version 1, replaced by version 2
    shutil.copytree(tiny_store_dir, model)
    v2_store, v1, v2 = second_version(tmp_path, tiny_store_dir, MODEL)
    state = tmp_path / "state"
    cluster = local_cluster(state, num_nodes=1)
    cfg = ControllerConfig(state_dir=state, nodes=1)
    spec = {"name": MODEL, "model": str(model), "autoscaling": {"keep_alive_s": 600}}
    tok = load_tokenizer(v2_store / "tokenizer.json")
    ids = tok.encode("Which version").ids
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    async def serve_one(ctl: Controller) -> list[int]:
        req = await ctl.submit(ctl.deployments[MODEL], ids, params)
        await asyncio.wait_for(req.done.wait(), 60)
        ctl.finished(req)
        return list(req.output_token_ids)

    async def run() -> list[int]:
        first = Controller(cfg, cluster.addresses, cluster.token)
        await first.start()
        try:
            await first.create(spec)
            await serve_one(first)
        finally:
            await first.stop()  # the agent keeps version 1's instance and copies
        assert _recorded(state) == v1.digest
        shutil.rmtree(model)
        shutil.copytree(v2_store, model)  # imported again while no controller runs
        second = Controller(cfg, cluster.addresses, cluster.token)
        with caplog.at_level(logging.WARNING):
            await second.start()
        try:
            return await serve_one(second)
        finally:
            await second.stop()

    with cluster:
        tokens = asyncio.run(run())
    assert _recorded(state) == v2.digest
    assert tok.decode(tokens) == Reference(v2_store)("Which version", 8)
    said = [m for m in _warnings(caplog) if "before the restart" in m]
    assert said == [
        f"deployment {MODEL!r} served version {v1.digest[:19]} before the restart; its model "
        f"store holds version {v2.digest[:19]} now (replaced while no controller ran): serving "
        f"{v2.digest[:19]}, the agents' copies of {v1.digest[:19]} dropped"
    ], _warnings(caplog)
