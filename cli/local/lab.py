"""`trustfabric lab up|down|status|apply|probe`: the lab fabric on this machine (root; lab/).

Local: it builds namespaces and Open vSwitch bridges here, and keeps its state in TRUSTFABRIC_HOME/lab.
Exit 0 ok (a probe that answers BLOCKED is an answer), 1 failure (one readable line), 2 usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.output import JsonOpt, console, emit_json, emit_table, guard


def _home() -> Path:
    from workflows.settings import Settings

    return Settings.from_env().home


def register(app: typer.Typer) -> None:
    lab = typer.Typer(help="The lab fabric: namespaces, Open vSwitch SuperNICs and Linux leaves on this machine "
                      "(root).", no_args_is_help=True)
    app.add_typer(lab, name="lab")

    @lab.command("up")
    def up_cmd(fabric_file: Path = typer.Argument(..., help="fabric YAML (the enforcer's format)"),
               mode: str = typer.Option("standalone", "--mode", help="standalone: compile the file with the "
                                        "shipped Rego and apply every device; agent: build the topology only, "
                                        "node agents apply the rule sets"),
               json_out: bool = JsonOpt) -> None:
        """Build the lab for FABRIC_FILE (one lab per TRUSTFABRIC_HOME)."""
        from lab import operations

        report = guard(lambda: operations.up(_home(), fabric_file, mode))
        if json_out:
            emit_json(report)
            return
        console.print(f"lab {report['lab']} up in {report['seconds']:.2f} s: {report['namespaces']} namespaces, "
                      f"{len(report['devices'])} devices, {report['workloads']} workloads; "
                      f"{len(report['applied'])} rule sets applied ({report['mode']})", highlight=False, soft_wrap=True)

    @lab.command("down")
    def down_cmd(json_out: bool = JsonOpt) -> None:
        """Remove the lab of this TRUSTFABRIC_HOME, also after a crash (found by its name prefix)."""
        from lab import operations

        report = guard(lambda: operations.down(_home()))
        if json_out:
            emit_json(report)
            return
        console.print(f"lab {report['lab']} down: {len(report['namespaces'])} namespaces and "
                      f"{report['processes']} processes removed", highlight=False, soft_wrap=True)

    @lab.command("status")
    def status_cmd(json_out: bool = JsonOpt) -> None:
        """The lab's state: devices (bridge / namespace of each device id), workloads, applied rule sets."""
        from lab import operations

        st = guard(lambda: operations.status(_home()))
        if json_out:
            emit_json(st)
            return
        console.print(f"lab {st['lab']}: {st['status']}", highlight=False, soft_wrap=True)
        if "devices" in st:
            rows = [(dev, d.get("bridge") or d.get("netns"), d.get("ovs_netns", ""), st["applied"].get(dev, "")[:12])
                    for dev, d in st["devices"].items()]
            emit_table("devices", ("device", "bridge / namespace", "ovs namespace", "applied"), rows)
            emit_table("workloads", ("workload", "node", "namespace", "ipv4", "ipv6"),
                       [(k, w["node"], w["netns"], w["ipv4"], w["ipv6"]) for k, w in st["workloads"].items()])
        if st.get("missing_namespaces"):
            console.print(f"missing namespaces: {', '.join(st['missing_namespaces'])}", highlight=False, soft_wrap=True)

    @lab.command("apply")
    def apply_cmd(fabric_file: Path = typer.Argument(None, help="default: the file the lab was built from"),
                  json_out: bool = JsonOpt) -> None:
        """Compile the (edited) fabric file again and apply only the devices whose rule set changed."""
        from lab import operations

        report = guard(lambda: operations.apply(_home(), fabric_file))
        if json_out:
            emit_json(report)
            return
        changed = ", ".join(report["applied"]) or "none"
        console.print(f"applied: {changed} ({len(report['unchanged'])} unchanged)", highlight=False, soft_wrap=True)

    @lab.command("probe")
    def probe_cmd(src: str = typer.Argument(..., help="tenant/group/name"),
                  dst: str = typer.Argument(..., help="tenant/group/name"),
                  port: int = typer.Argument(..., min=1, max=65535),
                  ipv6: bool = typer.Option(False, "--ipv6", help="over the workloads' IPv6 addresses"),
                  timeout: float = typer.Option(0.5, "--timeout", min=0.05, max=30.0,
                                                help="seconds to wait for the handshake"),
                  json_out: bool = JsonOpt) -> None:
        """Open a real TCP connection from SRC to DST:PORT; print OPEN or BLOCKED and which rule decided."""
        from lab import operations

        result = guard(lambda: operations.probe(_home(), src, dst, port, 6 if ipv6 else 4, timeout))
        out: dict[str, Any] = result.to_dict()
        if json_out:
            emit_json(out)
            return
        console.print(f"{out['result']}  {src} -> {dst} tcp/{port} (IPv{out['family']}, "
                      f"{out['seconds'] * 1000:.1f} ms)", highlight=False, soft_wrap=True)
        console.print(f"  decided by: {'; '.join(out['decided_by'])}", highlight=False, soft_wrap=True)
        enf = out["enforcer"]
        if enf["allows"] is not None:
            word = "allow" if enf["allows"] else "deny"
            console.print(f"  enforcer (applied rule sets): {word}: {enf['detail']} -- "
                          f"{'agrees' if out['agrees'] else 'DISAGREES'} with the wire", highlight=False,
                          soft_wrap=True)
