"""`surge serve --launcher ray`: node agents as Ray actors on a local Ray cluster that the
test starts on loopback (and shuts down), data over surge's own transport; greedy answers
equal a local run, and no agent outlives the server."""

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'surge[ray]')")

from tests.control.conftest import start_serve  # noqa: E402
from tests.control.test_serve_openai import GREEDY, MODEL  # noqa: E402


@pytest.fixture
def ray_address():
    """A one-node Ray cluster on 127.0.0.1, no dashboard; its GCS address."""
    ctx = ray.init(
        num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False
    )
    try:
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()


@pytest.mark.timeout(240)
def test_serve_with_ray_actors(ray_address, tmp_path, surge_home, tiny_store_dir, reference):
    import openai

    config = {"nodes": 2, "deployments": [{"name": MODEL, "model": str(tiny_store_dir)}]}
    s = start_serve(tmp_path, surge_home, config, "--launcher", "ray", "--ray-address", ray_address)
    try:
        nodes = s.http.get("/v1/nodes").json()["data"]
        assert [n["up"] for n in nodes] == [True, True]
        assert all(n["pid"] and n["address"][0] == "127.0.0.1" for n in nodes)
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        out = c.completions.create(model=MODEL, prompt="Ray says", max_tokens=8, **GREEDY)
        assert out.choices[0].text == reference("Ray says", 8)
    finally:
        s.stop()  # fails the test if an agent outlived surge serve
