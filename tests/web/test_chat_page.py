"""The chat page of `drift api` in a real headless Chromium, over a real loopback swarm.

Two block servers of a tiny random chat model (tests/api/conftest.py) behind the SDK and the
real API app: the page loads the model list with the typed key, sends a message, shows the
streamed tokens as they arrive (a MutationObserver counts the updates), and its final text
equals the API's non-streamed answer at temperature 0; the reply names the servers that ran
the blocks and the tokens/s. Skipped when /usr/bin/chromium is absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import pytest

from tests.web.cdp import CHROMIUM, Browser

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (scripts/ci_system_deps.sh)",
                allow_module_level=True)  # fmt: skip

from drift.api.app import ApiConfig, build_api_app  # noqa: E402
from drift.api.service import ServiceConfig  # noqa: E402
from drift.api.swarm import swarm_engine  # noqa: E402
from tests.api.apps import char_tokenizer, tiny_chat_model  # noqa: E402

pytestmark = pytest.mark.timeout(240)
KEY = "sk-page"
WEB = Path(__file__).resolve().parents[2] / "web"
MESSAGE = "Hello, who are you?"
OBSERVE = """(() => {
  window.updates = 0;
  new MutationObserver(() => { window.updates += 1; })
    .observe(document.querySelector('[data-testid=conversation]'),
             {childList: true, subtree: true, characterData: true});
  return true;
})()"""
REPLY = "document.querySelector('.msg.assistant')"


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("chat-page")
    tiny_chat_model().save_pretrained(directory, safe_serialization=True)
    char_tokenizer().save_pretrained(directory)
    return directory


async def test_chat_page_streams_the_api_answer(chat_dir: Path, swarms, sdk_models,
                                                web_apps) -> None:  # fmt: skip
    swarm = await swarms.start(chat_dir, [(0, 2), (2, 4)])
    model = await sdk_models.open(chat_dir, swarm.token)
    engine = swarm_engine(model, char_tokenizer(), model_id="tiny-chat")
    config = ApiConfig((KEY,), service=ServiceConfig(default_max_tokens=40), web_dir=WEB)
    url = await web_apps.start(build_api_app(engine, config))
    body = {"model": "tiny-chat", "temperature": 0,
            "messages": [{"role": "user", "content": MESSAGE}]}  # fmt: skip
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as http:
        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
            expected = (await r.json())["choices"][0]["message"]["content"]
    assert len(expected) > 5, (
        "the reference answer must say something for the test to mean anything"
    )

    async with Browser.start() as page:
        await page.navigate(f"{url}/")
        await page.wait_for("document.body.dataset.state === 'loading'")
        await page.wait_for(
            "document.querySelector('[data-testid=status]').textContent.includes('key')"
        )
        await page.evaluate(f"""(() => {{
            const key = document.querySelector('[data-testid=api-key]');
            key.value = {json.dumps(KEY)};
            key.dispatchEvent(new Event('change'));
            document.querySelector('[data-testid=temperature]').value = '0';
            return true; }})()""")  # fmt: skip
        await page.wait_for("document.body.dataset.state === 'ready'")
        picked = await page.evaluate("document.querySelector('[data-testid=model-picker]').value")
        assert picked == "tiny-chat"
        await page.evaluate(OBSERVE)
        await page.evaluate(f"""(() => {{
            document.querySelector('[data-testid=message-input]').value = {json.dumps(MESSAGE)};
            document.querySelector('[data-testid=send]').click();
            return true; }})()""")  # fmt: skip
        await page.wait_for(f"{REPLY} && {REPLY}.dataset.done === 'true'", timeout=120)
        text = await page.evaluate(f"{REPLY}.querySelector('.text').textContent")
        meta = await page.evaluate(f"{REPLY}.querySelector('[data-testid=reply-meta]').textContent")
        updates = await page.evaluate("window.updates")
        errors = await page.evaluate("document.querySelectorAll('.msg.error').length")
    assert errors == 0, page.console
    assert text == expected
    assert updates > 3, f"the reply arrived in {updates} updates: not streamed"
    assert "tokens/s" in meta and "served by" in meta
    for server in swarm.servers:
        peer = server.node.peer_id
        assert f"{peer[:8]}…{peer[-4:]}" in meta
    assert "[0, 2)" in meta and "[2, 4)" in meta
