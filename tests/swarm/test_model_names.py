"""One model name everywhere: what a user typed to start a server (alias, directory, GGUF file,
Hub id) names it in `/swarm/coverage?model=` too, over real HTTP on a real node."""

from __future__ import annotations

import aiohttp
import pytest

from drift.models.sources.aliases import ALIASES
from drift.swarm import coverage
from drift.swarm.names import ALIAS_NAMES, join_name, model_names, names_match, same_model
from drift.wire.errors import NotFound
from tests.node.node_helpers import Nodes
from tests.swarm.swarm_helpers import make_record


def test_alias_table_is_the_model_codes() -> None:
    assert ALIAS_NAMES == {key: alias.name for key, alias in ALIASES.items()}


@pytest.mark.parametrize(("typed", "recorded"), [
    ("smollm2", "SmolLM2-135M-Instruct"),  # alias -> its display name
    ("SMOLLM2", "SmolLM2-135M-Instruct"),
    ("SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct"),  # the dashboard's join command
    ("/data/models/acme-chat", "acme-chat"),  # directory -> its base name
    ("./acme-chat/", "acme-chat"),
    ("C:\\models\\acme-chat", "acme-chat"),
    ("/data/SmolLM2.Q4_1.gguf", "SmolLM2.Q4_1"),  # GGUF -> its stem
    ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B-Instruct"),  # Hub id as typed
])  # fmt: skip
def test_typed_names_match_records(typed: str, recorded: str) -> None:
    assert names_match(typed, recorded)
    assert model_names(typed)[0] == typed


def test_other_names_do_not_match() -> None:
    assert not names_match("smollm2", "gemma-3-270m")
    assert not names_match("/data/acme", "acme-chat")
    assert not names_match("x.gguf", None)


def test_coverage_by_typed_name_and_fingerprint_first() -> None:
    demo = make_record(span=(0, 8), model="SmolLM2-135M-Instruct", fingerprint="d3m0")
    assert coverage([demo], "smollm2").model_fingerprint == "d3m0"
    with pytest.raises(NotFound, match="no server in the swarm serves model 'gemma3-270m'"):
        coverage([demo], "gemma3-270m")


async def test_node_coverage_accepts_the_alias(nodes: Nodes) -> None:
    node, run = await nodes.start()
    node.announce(role="server", model="SmolLM2-135M-Instruct", model_fingerprint="abc",
                  num_blocks=4, start_block=0, end_block=4, throughput=1.0)  # fmt: skip
    base = f"http://127.0.0.1:{run.port}/swarm/coverage?model="
    async with aiohttp.ClientSession() as http:
        for typed in ("smollm2", "SmolLM2-135M-Instruct", "abc"):
            async with http.get(base + typed) as resp:
                body = await resp.json()
                assert resp.status == 200 and body["missing"] == [], (typed, body)
        async with http.get(base + "gemma3-270m") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"


@pytest.mark.parametrize(("a", "b"), [
    ("smollm2", "SmolLM2-135M-Instruct"),
    ("SmolLM2-135M-Instruct", "smollm2"),  # the API started with no MODEL: the swarm's name
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2"),
    ("/data/models/acme-chat", "acme-chat"),
    ("acme-chat", "/data/models/acme-chat"),
    ("/data/SmolLM2.Q4_1.gguf", "SmolLM2.Q4_1"),
])  # fmt: skip
def test_same_model_both_ways(a: str, b: str) -> None:
    assert same_model(a, b) and same_model(b, a)


def test_same_model_refuses_others() -> None:
    assert not same_model("smollm2", "gemma3-270m")
    assert not same_model("smollm2:chat", "smollm2")  # an adapter id is not the base
    assert not same_model("/data/acme", "acme-chat")


def test_join_name_is_what_another_machine_types() -> None:
    assert join_name("SmolLM2-135M-Instruct") == "smollm2"
    assert join_name("gemma-3-270m") == "gemma3-270m"
    assert join_name("meta-llama/Llama-3.2-1B-Instruct") == "meta-llama/Llama-3.2-1B-Instruct"
    assert join_name("acme-chat") == "acme-chat"
    assert join_name(None) is None


async def test_node_coverage_names_the_join_model(nodes: Nodes) -> None:
    node, run = await nodes.start()
    node.announce(role="server", model="SmolLM2-135M-Instruct", model_fingerprint="abc",
                  num_blocks=4, start_block=0, end_block=4, throughput=1.0)  # fmt: skip
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{run.port}/swarm/coverage") as resp:
            body = await resp.json()
    assert body["model"] == "SmolLM2-135M-Instruct" and body["join_model"] == "smollm2"
