"""`drift up --print-service systemd|launchd`: the unit / agent that runs this node as a service.

The service runs the same `drift up` command line (without --print-service) from the same
directory, with the identity and cache dir made explicit and absolute (a restart keeps the
peer id and so the printed join command), the DRIFT_* settings of this environment, and
$DRIFT_SERVICE naming the manager and unit: the node writes it into its process record,
so `drift down` tells the user to stop it there instead of stopping what would be
restarted. Secrets are never written into a unit: a swarm key given inline is refused.
Pure text; installs and starts nothing.
"""

from __future__ import annotations

import os
import plistlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from drift.cli._secrets import SECRET_ENV
from drift.cli._settings import CONFIG_ENV, ENV_VARS
from drift.wire.errors import BadRequest

SERVICE_ENV = "DRIFT_SERVICE"  # "<manager>:<unit>", set by the unit, recorded by the node
MANAGERS = ("systemd", "launchd")
DEFAULT_NAME = "drift-node"
_FLAG = "--print-service"


@dataclass(frozen=True)
class ServiceSpec:
    """What the unit runs: argv (absolute python first), from `cwd`, with `env`."""

    manager: str
    name: str  # systemd unit name without .service; launchd label
    argv: list[str]
    cwd: Path
    env: dict[str, str]


def service_argv(argv: Sequence[str], *, identity_path: Path, cache_dir: Path) -> list[str]:
    """The node's command line: `argv` (drift's own, after the program name) without
    --print-service / --service_name, with --identity_path and --cache_dir absolute."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in (_FLAG, "--service_name", "--identity_path", "--cache_dir"):
            skip = "=" not in arg
            continue
        if flag == "--swarm_key":
            raise BadRequest("--print-service would write the swarm key into the unit in plain "
                             "text: put it in a file (mode 0600) and pass --swarm_key_file")  # fmt: skip
        out.append(arg)
    exe = [sys.executable, "-m", "drift.cli"]
    return [*exe, *out, "--identity_path", str(identity_path), "--cache_dir", str(cache_dir)]


def service_env(environ: Mapping[str, str], manager: str, name: str) -> dict[str, str]:
    """DRIFT_* settings worth keeping (not secrets: refused), plus $DRIFT_SERVICE."""
    if environ.get("DRIFT_SWARM_KEY"):
        raise BadRequest("--print-service would write $DRIFT_SWARM_KEY into the unit in "
                         "plain text: put the key in a file and set $DRIFT_SWARM_KEY_FILE "
                         "or pass --swarm_key_file")  # fmt: skip
    keep = (set(ENV_VARS) | {CONFIG_ENV, "DRIFT_CACHE"}) - set(SECRET_ENV)
    env = {k: environ[k] for k in sorted(keep) if environ.get(k)}
    env["PYTHONUNBUFFERED"] = "1"
    env[SERVICE_ENV] = f"{manager}:{unit_file_name(manager, name)}"
    return env


def unit_file_name(manager: str, name: str) -> str:
    return f"{name}.service" if manager == "systemd" else name


def _systemd_quote(arg: str) -> str:
    """One ExecStart word, quoted as systemd.service(5) reads it (% and $ are specifiers)."""
    text = arg.replace("%", "%%").replace("$", "$$")
    if text and not any(c in text for c in " \t\"'\\;"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_systemd(spec: ServiceSpec) -> str:
    unit = unit_file_name("systemd", spec.name)
    path = f"~/.config/systemd/user/{unit}"
    env = "".join(f"Environment={_systemd_quote(f'{k}={v}')}\n" for k, v in spec.env.items())
    return (
        f"# {path}: a DRIFT node as a systemd user service (`drift up --print-service systemd`)\n"
        f"#   install: drift up ... --print-service systemd > {path}\n"
        f"#            systemctl --user daemon-reload && systemctl --user enable --now {spec.name}\n"
        f"#            loginctl enable-linger $USER   # keep it running while logged out\n"
        f"#   logs:    journalctl --user -u {spec.name} -f\n"
        f"#   stop:    systemctl --user stop {spec.name}   (drift down leaves it to systemd)\n"
        "[Unit]\n"
        f"Description=DRIFT node ({spec.name})\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"WorkingDirectory={_systemd_quote(str(spec.cwd))}\n"
        f"{env}"
        f"ExecStart={' '.join(_systemd_quote(a) for a in spec.argv)}\n"
        "Restart=always\n"
        "RestartSec=10\n"
        "KillSignal=SIGTERM\n"
        "TimeoutStopSec=60\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def launchd_log(name: str) -> str:
    return str(Path.home() / "Library" / "Logs" / f"{name}.log")


def render_launchd(spec: ServiceSpec) -> str:
    plist = {
        "Label": spec.name,
        "ProgramArguments": spec.argv,
        "WorkingDirectory": str(spec.cwd),
        "EnvironmentVariables": spec.env,
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": 10,
        "StandardOutPath": launchd_log(spec.name),
        "StandardErrorPath": launchd_log(spec.name),
    }
    body = plistlib.dumps(plist, sort_keys=False).decode()
    path = f"~/Library/LaunchAgents/{spec.name}.plist"
    note = (
        f"<!-- {path}: a DRIFT node as a launchd agent (drift up, option print-service launchd)\n"
        f"  install: save this output as {path}, then\n"
        f"           launchctl bootstrap gui/$(id -u) {path}\n"
        f"  logs:    {launchd_log(spec.name)}\n"
        f"  stop:    launchctl bootout gui/$(id -u)/{spec.name}   (drift down leaves it to launchd)\n"
        "-->\n"
    )
    assert "--" not in note[4:-4], "an XML comment cannot hold a double hyphen"
    head, rest = body.split("\n", 1)  # the XML declaration must stay first
    return f"{head}\n{note}{rest}"


def render(spec: ServiceSpec) -> str:
    return render_systemd(spec) if spec.manager == "systemd" else render_launchd(spec)


def build_spec(manager: str, name: str, argv: Sequence[str], *, identity_path: Path,
               cache_dir: Path, environ: Mapping[str, str] | None = None) -> ServiceSpec:  # fmt: skip
    environ = os.environ if environ is None else environ
    if manager not in MANAGERS:
        raise BadRequest(f"--print-service {manager!r}: expected one of {', '.join(MANAGERS)}")
    if not name or any(c in name for c in "/ \t\n"):
        raise BadRequest(f"--service_name {name!r}: a name without spaces or slashes")
    return ServiceSpec(manager, name,
                       service_argv(argv, identity_path=identity_path.resolve(),
                                    cache_dir=cache_dir.resolve()),
                       Path.cwd(), service_env(environ, manager, name))  # fmt: skip


def current_service(environ: Mapping[str, str] | None = None) -> str | None:
    """'systemd:drift-node.service' when this process runs under a unit printed here."""
    value = (os.environ if environ is None else environ).get(SERVICE_ENV, "")
    manager, _, unit = value.partition(":")
    return value if manager in MANAGERS and unit else None


def stop_hint(service: str) -> str:
    """How to stop a node run by `service` ('<manager>:<unit>')."""
    manager, _, unit = service.partition(":")
    if manager == "systemd":
        return f"systemctl --user stop {unit.removesuffix('.service')}"
    return f"launchctl bootout gui/$(id -u)/{unit}"
