"""`trustfabric lab up|down|status|apply|probe`: the lab fabric on this machine (root; lab/).

Local: it builds namespaces and Open vSwitch bridges here, and keeps its state in TRUSTFABRIC_HOME/lab.
Exit 0 done (a probe: OPEN); 1 failure: a probe answered BLOCKED (as `nc -z`), an error (one readable line);
2 usage: a bad argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.output import LOCAL, add_group, answer_no, command, console, emit, emit_table, guard, machine_output
from cli.params import PORT, choice, existing_file


def _home() -> Path:
    from cli.output import local_settings

    return Path(local_settings().home)


def _print_probe(out: dict[str, Any], src: str, dst: str, port: int) -> None:
    console.print(f"{out['result']}  {src} -> {dst} tcp/{port} (IPv{out['family']}, "
                  f"{out['seconds'] * 1000:.1f} ms)", highlight=False, soft_wrap=True)
    console.print(f"  decided by: {'; '.join(out['decided_by'])}", highlight=False, soft_wrap=True)
    enf = out["enforcer"]
    if enf["allows"] is not None:
        word = "allow" if enf["allows"] else "deny"
        console.print(f"  enforcer (applied rule sets): {word}: {enf['detail']} -- "
                      f"{'agrees' if out['agrees'] else 'DISAGREES'} with the wire", highlight=False,
                      soft_wrap=True)
    if out.get("stale"):
        console.print(f"  stale: {'; '.join(out['stale'])}: `trustfabric lab apply` applies what the file says now",
                      highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    lab = add_group(app, "lab", "The lab fabric: namespaces, Open vSwitch SuperNICs and Linux leaves on this "
                    "machine (root).", LOCAL)

    @command(lab, "up", LOCAL)
    def up_cmd(fabric_file: Path = typer.Argument(..., help="fabric YAML (the enforcer's format)",
                                                  **existing_file()),
               mode: str = typer.Option("standalone", "--mode", parser=choice("standalone", "agent"),
                                        metavar="standalone|agent", help="standalone: compile the file with the "
                                        "shipped Rego and apply every device; agent: build the topology only, "
                                        "node agents apply the rule sets")) -> None:
        """Build the lab for FABRIC_FILE (one lab per TRUSTFABRIC_HOME)."""
        from lab import operations

        report = guard(lambda: operations.up(_home(), fabric_file, mode))
        if machine_output():
            emit(report)
            return
        console.print(f"lab {report['lab']} up in {report['seconds']:.2f} s: {report['namespaces']} namespaces, "
                      f"{len(report['devices'])} devices, {report['workloads']} workloads; "
                      f"{len(report['applied'])} rule sets applied ({report['mode']})", highlight=False, soft_wrap=True)

    @command(lab, "down", LOCAL)
    def down_cmd() -> None:
        """Remove the lab of this TRUSTFABRIC_HOME, also after a crash (found by its name prefix)."""
        from lab import operations

        report = guard(lambda: operations.down(_home()))
        if machine_output():
            emit(report)
            return
        console.print(f"lab {report['lab']} down: {len(report['namespaces'])} namespaces and "
                      f"{report['processes']} processes removed", highlight=False, soft_wrap=True)

    @command(lab, "status", LOCAL)
    def status_cmd() -> None:
        """The lab's state: devices (bridge / namespace of each device id), workloads, applied rule sets."""
        from lab import operations

        st = guard(lambda: operations.status(_home()))
        if machine_output():
            emit(st)
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

    @command(lab, "apply", LOCAL)
    def apply_cmd(fabric_file: Path = typer.Argument(None, help="default: the file the lab was built from",
                                                     **existing_file())) -> None:
        """Compile the (edited) fabric file again and apply the devices whose rule set changed, or that drifted."""
        from lab import operations

        report = guard(lambda: operations.apply(_home(), fabric_file))
        if machine_output():
            emit(report)
            return
        changed = ", ".join(report["applied"]) or "none"
        console.print(f"applied: {changed} ({len(report['unchanged'])} unchanged)", highlight=False, soft_wrap=True)
        for device, diff in report["repaired"].items():
            console.print(f"repaired drift on {device}: {len(diff)} difference(s), e.g. {diff[0]}",
                          highlight=False, soft_wrap=True)

    @command(lab, "probe", LOCAL)
    def probe_cmd(src: str = typer.Argument(..., help="tenant/group/name"),
                  dst: str = typer.Argument(..., help="tenant/group/name"),
                  port: int = typer.Argument(..., parser=PORT, metavar="PORT"),
                  ipv6: bool = typer.Option(False, "--ipv6", help="over the workloads' IPv6 addresses"),
                  timeout: float = typer.Option(0.5, "--timeout", min=0.05, max=30.0,
                                                help="seconds to wait for the handshake")) -> None:
        """Open a real TCP connection from SRC to DST:PORT; print OPEN or BLOCKED and which rule decided (exit 0
        OPEN, 1 BLOCKED, as `nc -z` answers)."""
        from lab import operations

        result = guard(lambda: operations.probe(_home(), src, dst, port, 6 if ipv6 else 4, timeout))
        out: dict[str, Any] = result.to_dict()
        if machine_output():
            emit(out)
        else:
            _print_probe(out, src, dst, port)
        if out["result"] != "OPEN":
            answer_no()
