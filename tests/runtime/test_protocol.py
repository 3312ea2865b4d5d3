"""The typed agent protocol: every message round-trips, bad requests get clear error replies
from a real agent (which keeps serving), and subscriptions get only what they asked for."""

import asyncio
import json
from dataclasses import dataclass

import pytest

from surge.engine.batch import BatchMeta
from surge.engine.ipc_handle import IpcHandle
from surge.engine.sampling import Draw, Sampled, SamplingParams, TokenLogprobs
from surge.errors import SurgeError
from surge.runtime import protocol as p
from surge.runtime.client import ClusterClient
from surge.runtime.transport import RemoteError
from tests.runtime.conftest import MODEL, connected

PARAMS = SamplingParams(max_tokens=4, temperature=0.5, top_p=0.9, top_k=3, seed=7)
PART = p.KvPart(first_layer=0, end_layer=2, shape=(2, 2, 3, 4, 8))

OPS = [
    p.SubscribeOp(),
    p.ShutdownOp(),
    p.StatusOp(),
    p.RegisterOp(model="m"),
    p.SetPeersOp(peers={0: ("127.0.0.1", 9000), 1: ("127.0.0.1", 9001)}, preconnect=False),
    p.LoadOp(model="m", blocks=(0, 1), tier="gpu", source="remote"),
    p.LoadOp(model="m", blocks=(0, 1), tier="gpu", source="disk", keep_host=True),
    p.LoadOp(model="m", blocks=(2,), tier="host", source="remote", priority="background"),
    p.EvictOp(model="m", blocks=(3,), tier="disk"),
    p.DropModelOp(model="m"),
    p.ChecksumsOp(model="m"),
    p.GenerateOp(model="m", prompt_token_ids=(1, 2), params=PARAMS),
    p.GetBlockOp(model="m", block=2, step=3.0, wait_s=1.5),
    p.MulticastOp(mc_id="x", model="m", recv=((1, 0, 2), (2, 1, 2)), tier="gpu", wait_s=5.0),
    p.PullFromOp(mc_id="x", model="m", block=1, src=3, step=2.0),
    p.GroupBroadcastOp(
        mc_id="x",
        model="m",
        rank=1,
        world_size=3,
        root=0,
        blocks=(0, 1),
        store_host="198.18.0.10",
        store_port=4242,
        timeout_s=9.0,
    ),
    p.StageOpenOp(pipeline="pp", model="m", first_layer=0, end_layer=2, next_node=1),
    p.StageStepOp(pipeline="pp", kind="tokens", shape=(1, 3), batch=BatchMeta((0,), (0,), (3,))),
    p.StageStepOp(
        pipeline="pp",
        kind="tokens",
        shape=(3, 1),
        batch=BatchMeta((0, 1, 2), (3, 4, 5), (1, 1, 1)),
        draws=(Draw(), None, Draw(temperature=0.5, top_p=0.9, top_k=3, seed=-7, logprobs=2)),
    ),
    p.StageStepOp(pipeline="pp", kind="hidden", draws=(Draw(logprobs=0),)),
    p.StageFreeOp(pipeline="pp", seq_ids=(0, 4)),
    p.StageCloseOp(pipeline="pp"),
    p.InstanceOpenOp(instance="i", model="m"),
    p.InstanceSubmitOp(instance="i", req_id="r1", prompt_token_ids=(1,), params=PARAMS),
    p.InstanceAdoptOp(
        instance="i",
        req_id="r1",
        prompt_token_ids=(1, 2),
        output_token_ids=(3,),
        num_cached=2,
        parts=(PART,),
    ),
    p.InstanceAdoptOp(
        instance="i",
        req_id="r2",
        prompt_token_ids=(1, 2),
        output_token_ids=(3,),
        num_cached=2,
        sources=(p.KvSource(0, "pp", 4, 2), p.KvSource(1, "pp", 4, 2)),
    ),
    p.InstanceAbortOp(instance="i", req_ids=("r1", "r2")),
    p.InstanceQueuedOp(instance="i"),
    p.InstanceTakeQueuedOp(instance="i", req_ids=("r1", "r2")),
    p.InstanceCloseOp(instance="i"),
    p.KvExportOp(pipeline="pp", seq_id=0, num_tokens=5),
    p.ExportDeviceOp(model="m", blocks=(0, 2)),
    p.OpenMateCopyOp(model="m", blocks=(0, 1), mate=1),
    p.KvImportOp(pipeline="pp", seq_id=0, parts=(PART,)),
    p.KvPushOp(
        pipeline="pp", new_pipeline="pp@1", seq_id=0, num_tokens=5, targets=(p.KvTarget(2, 0, 3),)
    ),
    p.StageKvCopyOp(pipeline="pp@1", source="pp", seqs=((0, 5), (1, 3))),
    p.StageProfileOp(pipeline="pp", num_tokens=8, repeats=1),
    p.InstanceRoleOp(instance="i", role="prefill"),
    p.InstanceHandoffOp(instance="i", req_id="r1"),
]

REPLIES = [
    p.GroupReply(store_host="198.18.0.10", store_port=4242),
    p.DeviceHandlesReply(
        handles=(
            IpcHandle(kind="fake", device_index=0, num_bytes=64, handle_hex="2f"),
            IpcHandle("cuda", 1, 128, "ab" * 64, 512, "cd" * 8, 3, "ef" * 64, True),
        )
    ),
    p.Ack(),
    p.HandoffReply(part=PART, output_token_ids=(3, 4), num_cached=5),
    p.KvPushReply(num_bytes=4096),
    p.LayerTimesReply(
        first_layer=2,
        prefill_s=(0.5, 0.25),
        decode_s=(0.125, 0.0625),
        activation_bytes_per_token=64,
    ),
    p.StatusReply(
        node=0,
        port=1,
        models={"m": p.ModelHolding(host=(0,), gpu=(), disk=(0, 1))},
        bytes_in=5,
        bytes_out=6,
        peers=(1, 2),
    ),
    p.RegisterReply(model="m", num_blocks=4),
    p.SetPeersReply(peers=(0, 1)),
    p.LoadReply(seconds=1.0, fetch_seconds=0.5),
    p.ChecksumsReply(checksums={0: "crc32:0000007b", 3: "crc32:000001c8"}),
    p.DropReply(aborted_ops=1, closed=2),
    p.GenerateReply(token_ids=(1, 2)),
    p.BlockReply(model="m", block=1),
    p.MulticastReply(mc_id="x", num_recv=3),
    p.PipelineReply(pipeline="pp"),
    p.StageStepReply(),
    p.StageStepReply(
        sampled=Sampled((4, 9), (None, TokenLogprobs(-0.25, ((9, -0.25), (3, -9999.0))))),
        spans=((0, 1.0, 2.0), (1, 2.0, 3.0)),
    ),
    p.InstanceReply(instance="i"),
    p.SubmitReply(),
    p.AdoptReply(seq_id=3),
    p.AbortReply(outputs={"r1": (4, 5), "r2": ()}),
    p.QueuedReply(req_ids=("r2",)),
    PART,
]

EVENTS = [
    p.BlockArrived(node=1, t=2.5, model="m", block=0, tier="host", source="disk"),
    p.BlockArrived(node=1, t=2.5, model="m", block=0, tier="gpu", mc_id="x", src=0, step=1.0),
    p.BlockArrived(node=1, t=2.5, model="m", block=0, tier="gpu", source="mate", src=0),
    p.ReceiveDone(node=1, t=3.0, mc_id="x", model="m"),
    p.BlockCorrupt(node=1, t=3.0, mc_id="x", model="m", block=2, src=0),
    p.PullFailed(node=1, t=3.0, mc_id="x", model="m", block=2, src=0, reason="gone"),
    p.TokenGenerated(
        node=1, t=3.0, instance="i", req_id="r", token=5, finished=True, finish_reason="length"
    ),
    p.RequestFailed(node=1, t=3.5, instance="i", req_id="r", error="the engine failed", model="m"),
    p.AgentDown(node=2, t=4.0),
    p.GroupDone(
        node=1,
        t=5.0,
        mc_id="x",
        model="m",
        rank=1,
        ready_t=4.5,
        setup_s=0.2,
        broadcast_s=0.3,
        num_bytes=64,
    ),
    p.GroupDone(
        node=2,
        t=5.0,
        mc_id="x",
        model="m",
        rank=2,
        ready_t=None,
        setup_s=None,
        broadcast_s=None,
        num_bytes=0,
        error="RuntimeError: timed out",
    ),
]


def test_every_op_reply_and_event_is_covered() -> None:
    assert {type(o) for o in OPS} == set(p.OPS.values())
    assert {type(e) for e in EVENTS} == set(p.EVENTS.values())
    assert {o.REPLY for o in OPS} <= {type(r) for r in REPLIES}


@pytest.mark.parametrize("msg", OPS + REPLIES + EVENTS, ids=lambda m: type(m).__name__)
def test_round_trip_through_json(msg) -> None:
    wire = json.loads(json.dumps(msg.to_json()))  # what crosses the socket
    assert type(msg).from_json(wire) == msg
    if isinstance(msg, p.Op):
        assert p.Op.decode({**wire, "length": 0}) == msg
    if isinstance(msg, p.Event):
        assert p.Event.decode(wire) == msg


def test_ops_agent_events_and_timeline_events_are_named_one_way() -> None:
    """One registry kind for every family (`json_codec.Registry`, filled by `Named`): a name
    defined twice is refused, and a family decodes only its own names."""
    from surge.events import EVENT_TYPES, BlockLanded, TimelineEvent

    for base, registry in ((p.Op, p.OPS), (p.Event, p.EVENTS), (TimelineEvent, EVENT_TYPES)):
        assert base.REGISTRY is registry and all(issubclass(c, base) for c in registry.values())
    with pytest.raises(TypeError, match="op 'load' is defined twice"):

        @dataclass(frozen=True)
        class AnotherLoad(p.Op[p.Ack], name="load"):
            pass

    with pytest.raises(TypeError, match="timeline event 'block' is defined twice"):

        @dataclass(frozen=True, kw_only=True)
        class AnotherBlock(TimelineEvent, name="block"):
            pass

    landed = BlockLanded(model="m", node=0, block=1, tier="gpu").to_json()
    assert TimelineEvent.decode(landed) == BlockLanded(model="m", node=0, block=1, tier="gpu")
    with pytest.raises(SurgeError, match="unknown event 'block'"):
        p.Event.decode(landed)  # a timeline event is not an agent's event


def test_json_keeps_the_dict_shape_senders_built() -> None:
    load = p.LoadOp(model="m", blocks=(0, 1))
    assert load.to_json() == {
        "op": "load",
        "model": "m",
        "blocks": [0, 1],
        "tier": "host",
        "source": "disk",
        "priority": "critical",
        "keep_host": False,
    }
    old_submit = {
        "op": "instance_submit",
        "instance": "i",
        "req_id": "r",
        "prompt_token_ids": [1, 2],
        "params": PARAMS.to_json(),
        "output_token_ids": [],
    }
    assert p.Op.decode(old_submit).to_json() == old_submit
    arrival = p.BlockArrived(node=1, t=2.0, model="m", block=3, tier="host", source="disk")
    assert arrival.to_json() == {
        "kind": "event",
        "type": "arrival",
        "node": 1,
        "t": 2.0,
        "model": "m",
        "block": 3,
        "tier": "host",
        "source": "disk",
    }


@pytest.mark.parametrize(
    "header, message",
    [
        ({"op": "teleport"}, "unknown op 'teleport'"),
        ({}, "unknown op None"),
        ({"op": "load", "model": "m"}, "op load: missing field 'blocks'"),
        ({"op": "load", "model": "m", "blocks": [0], "tier": "ram"}, "field 'tier' must be"),
        ({"op": "load", "model": "m", "blocks": [-1]}, "block indices must be >= 0"),
        (
            {"op": "load", "model": "m", "blocks": [0], "source": "host", "keep_host": True},
            "keep_host is for a gpu load from disk or remote",
        ),
        ({"op": "evict", "model": "m", "blocks": [0], "tire": "gpu"}, "unknown field"),
        ({"op": "get_block", "model": "m", "block": "3"}, "field 'block' must be an integer"),
        ({"op": "stage_step", "pipeline": "p", "kind": "tokens"}, "needs shape and batch"),
        (
            {"op": "stage_step", "pipeline": "p", "kind": "tokens", "shape": [1, 1]}
            | {"batch": {"seq_ids": [0], "ctx_lens": [0], "q_lens": [1]}, "draws": [{}, {}]},
            "2 draws for 1 rows",
        ),
        (
            {"op": "stage_step", "pipeline": "p", "kind": "hidden", "draws": [{"temperature": 1}]},
            "a sampled row needs its seed",
        ),
        (
            {"op": "stage_step", "pipeline": "p", "kind": "hidden", "draws": [{"top_k": -1}]},
            "top_k must be >= 0",
        ),
        (
            {"op": "stage_open", "pipeline": "p", "model": "m", "first_layer": 2, "end_layer": 2},
            "first_layer < end_layer",
        ),
        (
            {"op": "generate", "model": "m", "prompt_token_ids": [1], "params": {"top_p": 0}},
            "top_p must be in",
        ),
        ({"op": "set_peers", "peers": {"a": ["h", 1]}}, "integer keys"),
        (
            {"op": "instance_adopt", "instance": "i", "req_id": "r", "prompt_token_ids": [1]}
            | {"output_token_ids": [2], "num_cached": 1},
            "needs K/V parts .* or sources, not both",
        ),
        (
            {"op": "instance_adopt", "instance": "i", "req_id": "r", "prompt_token_ids": [1]}
            | {"output_token_ids": [2], "num_cached": 1, "parts": [PART.to_json()]}
            | {"sources": [{"node": 0, "pipeline": "p", "seq_id": 0, "num_tokens": 1}]},
            "not both",
        ),
    ],
)
def test_bad_ops_raise_a_clear_error(header, message) -> None:
    with pytest.raises(SurgeError, match=message):
        p.Op.decode(header)


def test_a_step_carries_a_few_bytes_a_row_each_way() -> None:
    """A greedy row's draw is `{}`, a sampled one's its settings and seed; the answer is
    token ids in the header and no payload (before: vocab x 4 bytes of logits a row)."""
    batch = BatchMeta((0, 1), (7, 9), (1, 1))
    draws = (Draw(), SamplingParams(temperature=1.0, seed=3).draw())
    op = p.StageStepOp(pipeline="pp", kind="hidden", batch=batch, draws=draws)
    assert op.to_json()["draws"] == [{}, {"temperature": 1.0, "seed": 3}]
    reply = p.StageStepReply(sampled=Sampled((17, 2)), spans=((0, 1.5, 2.5),))
    assert reply.to_json()["sampled"] == {"tokens": [17, 2], "logprobs": []}
    assert SamplingParams(temperature=1.0).draw().seed is not None  # drawn once, sent along
    assert SamplingParams(seed=3).draw() == Draw()  # greedy: no seed needed


def test_sampling_params_json() -> None:
    assert SamplingParams.from_json(PARAMS.to_json()) == PARAMS
    assert SamplingParams.from_json({}) == SamplingParams()
    assert SamplingParams.from_json({"stop_token_ids": [2, 3]}).stop_token_ids == (2, 3)
    for bad in ({"max_tokens": 0}, {"max_tokens": True}, {"seed": "x"}, {"colour": 1}):
        with pytest.raises(SurgeError):
            SamplingParams.from_json(bad)


def token_of(model: str, req_id: str) -> p.TokenGenerated:
    return p.TokenGenerated(
        node=0, t=1.0, instance=model, req_id=req_id, token=1, finished=False,
        finish_reason=None, model=model,
    )  # fmt: skip


def test_subscriptions_are_filtered_at_publish() -> None:
    async def run() -> tuple[list, list, list, list]:
        client = ClusterClient({}, "token")
        arrivals = client.subscribe((p.BlockArrived,))
        tokens_of_a = client.subscribe((p.TokenGenerated, p.AgentDown), model="a")
        everything = client.subscribe(tuple(p.EVENTS.values()))
        gone = client.subscribe((p.BlockArrived,))
        client.unsubscribe(gone)
        for ev in [
            p.BlockArrived(node=0, t=1.0, model="a", block=0, tier="host"),
            token_of("a", "r"),
            token_of("b", "s"),
            p.AgentDown(node=0, t=2.0),
        ]:
            client._publish(ev)
        drain = [[q.get_nowait() for _ in range(q.qsize())] for q in (arrivals, tokens_of_a)]
        rest = [everything.get_nowait() for _ in range(everything.qsize())]
        return drain[0], drain[1], rest, [gone.qsize()]

    arrivals, tokens_of_a, everything, gone = asyncio.run(run())
    assert [type(e) for e in arrivals] == [p.BlockArrived]
    assert [type(e) for e in tokens_of_a] == [p.TokenGenerated, p.AgentDown]
    assert tokens_of_a[0].req_id == "r"
    assert [e.NAME for e in everything] == ["arrival", "token", "token", "agent_down"]
    assert gone == [0]


def test_a_real_agent_answers_bad_ops_with_errors_and_keeps_serving(make_cluster, manifest) -> None:
    cluster = make_cluster(1)

    async def run() -> tuple[list[str], p.StatusReply]:
        client = await connected(cluster, manifest, loads={})
        errors = []
        try:
            for bad in (
                {"op": "teleport"},
                {"op": "load", "model": MODEL, "blocks": "all"},
                {"op": "load", "model": MODEL, "blocks": [0], "tier": "ram"},
                {"op": "load", "model": MODEL, "blocks": [99]},
                {"op": "evict", "model": "nope", "blocks": [0]},
                {"op": "instance_submit", "instance": "x", "req_id": "r", "prompt_token_ids": [1]},
            ):
                with pytest.raises(RemoteError) as e:
                    await client.conns[0].request(bad)  # raw dicts: typed ops cannot be bad
                errors.append(str(e.value))
            await client.call(0, p.LoadOp(model=MODEL, blocks=(0, 1), source="remote"))
            return errors, await client.call(0, p.StatusOp())
        finally:
            await client.close()

    errors, status = asyncio.run(run())
    assert "unknown op 'teleport'" in errors[0]
    assert "field 'blocks' must be a list" in errors[1]
    assert "field 'tier' must be" in errors[2]
    assert "block 99 is out of range" in errors[3]
    assert "'nope' is not registered" in errors[4]
    assert "no instance x" in errors[5]
    assert status.models[MODEL].host == (0, 1)  # still serving after every bad request


def test_a_subscriber_of_arrivals_never_sees_tokens(make_cluster, manifest) -> None:
    cluster = make_cluster(1)

    async def run() -> tuple[list[p.Event], list[p.Event]]:
        client = await connected(cluster, manifest, loads={})
        arrivals = client.subscribe((p.BlockArrived,), model=MODEL)
        tokens = client.subscribe((p.TokenGenerated,))
        try:
            every = tuple(range(manifest.num_blocks))
            await client.call(0, p.LoadOp(model=MODEL, blocks=every, tier="gpu", source="remote"))
            await client.call(0, p.InstanceOpenOp(instance="i", model=MODEL))
            params = SamplingParams(max_tokens=3, ignore_eos=True)
            ask = p.InstanceSubmitOp(
                instance="i", req_id="r", prompt_token_ids=(0, 5), params=params
            )
            await client.call(0, ask)
            got_tokens = [await asyncio.wait_for(tokens.get(), 30) for _ in range(3)]
            await client.call(0, p.InstanceCloseOp(instance="i"))
            return [arrivals.get_nowait() for _ in range(arrivals.qsize())], got_tokens
        finally:
            await client.close()

    arrivals, tokens = asyncio.run(run())
    assert [type(e) for e in arrivals] == [p.BlockArrived] * manifest.num_blocks
    assert sorted(e.block for e in arrivals) == list(range(manifest.num_blocks))
    assert all(isinstance(e, p.TokenGenerated) and e.req_id == "r" for e in tokens)
    assert [e.finished for e in tokens] == [False, False, True]
    assert tokens[0].model == MODEL and tokens[-1].finish_reason == "length"
