"""Re-take docs/dashboard.png: the dashboard of `drift demo --keep`'s swarm under load.

Opens the dashboard in headless Chromium (tests/web/cdp.py, /usr/bin/chromium), runs a few
`drift generate` requests through the swarm while the page polls, then saves a 1280 px
screenshot with the load charts filled in.

    drift demo --keep                       # prints the dashboard URL and the join token
    PYTHONPATH=. python scripts/dashboard_screenshot.py URL TOKEN docs/dashboard.png
    drift down
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.web.cdp import Browser  # noqa: E402

PROMPTS = (
    "Write a short poem about rivers and mountains.",
    "Explain what a transformer block does.",
    "List three facts about Paris.",
    "Describe a sunrise over the sea.",
    "Give advice to a new gardener.",
    "What makes a good cup of tea?",
)


async def main(url: str, token: str, out: Path) -> None:
    async with Browser.start() as page:
        await page.set_viewport(1280, 900)
        await page.set_color_scheme("light")
        await page.navigate(url)
        await page.wait_for("document.querySelectorAll('[data-testid=load-server]').length > 0")
        for prompt in PROMPTS:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "drift", "generate", "--initial_peers", token,
                "--max_new_tokens", "64", prompt,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await proc.wait()
        await asyncio.sleep(3)  # one more poll after the last answer
        await page.screenshot(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
