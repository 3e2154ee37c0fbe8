"""`trustfabric agent --node NAME --server URL --ca FILE`: the node agent (agent/), in the foreground.

On a node: it runs on the node it serves (a GPU node, or in the lab a leaf) with a data directory of its own
and no server database; it reaches the server over HTTPS only. Its devices: the lab's (`--lab`), or a real
node's OVS bridge (`--ovs-bridge`) and/or a real leaf's NVUE API (`--nvue`). Stops on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli.output import EXIT_USAGE, NODE, check_listen_address, command, fail
from cli.params import (
    BRIDGE,
    DEVICE_URL,
    HOST_PORT,
    HTTPS_URL,
    JOIN_TOKEN,
    PORT_MAP,
    SLUG,
    USER,
    existing_dir,
    existing_file,
)


def register(app: typer.Typer) -> None:
    @command(app, "agent", NODE, output=False)
    def agent_cmd(
        node: str = typer.Option(..., "--node", parser=SLUG, metavar=SLUG.metavar,
                                 help="this node's name (a GPU node; in the lab also a leaf)"),
        server: str = typer.Option(..., "--server", parser=HTTPS_URL, metavar=HTTPS_URL.metavar,
                                   help="the API, e.g. https://127.0.0.1:8443"),
        ca: Path = typer.Option(..., "--ca", help="the trust domain's roots (PEM) to verify the server with, beside "
                                "the bundle the agent fetches: `trustfabric bundle show --pem`", **existing_file()),
        join_token: str | None = typer.Option(None, "--join-token", parser=JOIN_TOKEN, metavar=JOIN_TOKEN.metavar,
                                              help="one-time token "
                                              "(`trustfabric node token create --node NAME`); needed only until "
                                              "the node holds an SVID"),
        join_token_file: Path | None = typer.Option(None, "--join-token-file", help="read the token from a file",
                                                    **existing_file()),
        data_dir: Path | None = typer.Option(None, "--data-dir", file_okay=False, help="node key, SVID and bundle "
                                             "(default ./.trustfabric-agent/NODE)"),
        key_file: Path | None = typer.Option(None, "--key-file", dir_okay=False, help="the 32-byte secret (mode "
                                             "0600) that encrypts the node key and SVID cache at rest; created on "
                                             "first start (default $CREDENTIALS_DIRECTORY/trustfabric-agent.key "
                                             "under systemd, else DATA_DIR.key beside the data directory)"),
        socket: Path | None = typer.Option(None, "--socket", dir_okay=False, help="the SPIFFE Workload API socket "
                                           "(default DATA_DIR/public/api.sock)"),
        metrics: str | None = typer.Option(None, "--metrics", parser=HOST_PORT, metavar=HOST_PORT.metavar,
                                           help="serve Prometheus metrics on HOST:PORT"),
        lab: Path | None = typer.Option(None, "--lab", help="apply rule sets to the lab of this TRUSTFABRIC_HOME "
                                        "(`lab up FILE --mode agent`)", **existing_dir()),
        ovs_bridge: str | None = typer.Option(None, "--ovs-bridge", parser=BRIDGE, metavar=BRIDGE.metavar,
                                              help="a real node: apply nic:NODE to this OVS (OVS-DOCA) bridge"),
        ovs_rundir: Path | None = typer.Option(None, "--ovs-rundir", help="the OVS run directory holding the bridge's "
                                               "OpenFlow socket (default /var/run/openvswitch)", **existing_dir()),
        ovs_port: list[str] = typer.Option([], "--ovs-port", parser=PORT_MAP, metavar=PORT_MAP.metavar,
                                           help="a fabric port's name on the bridge, when it differs (repeatable)"),
        nvue: str | None = typer.Option(None, "--nvue", parser=DEVICE_URL, metavar=DEVICE_URL.metavar,
                                        help="a real leaf: apply leaf:NODE through this NVUE REST API "
                                        "(e.g. https://127.0.0.1:8765 on the switch)"),
        nvue_user: str | None = typer.Option(None, "--nvue-user", parser=USER, metavar=USER.metavar,
                                             help="the NVUE user (with --nvue-password-file)"),
        nvue_password_file: Path | None = typer.Option(None, "--nvue-password-file", help="the NVUE password",
                                                       **existing_file()),
        nvue_ca: Path | None = typer.Option(None, "--nvue-ca", help="the switch certificate's CA (PEM; default the "
                                            "system's)", **existing_file()),
    ) -> None:
        """Run the node agent: attest, apply this node's rule sets, serve the SPIFFE Workload API."""
        import logging
        import signal

        from agent.identity import BUNDLE_FILE
        from agent.runner import Agent, AgentConfig
        from agent.wiring import SYSTEM_OVS_RUNDIR, NvueLeaf, OvsNode
        from core.errors import TrustfabricError

        if lab is not None and (ovs_bridge or nvue):
            fail("--lab drives the lab's devices, --ovs-bridge and --nvue a real node's: give one or the other",
                 code=EXIT_USAGE)
        if (ovs_rundir or ovs_port) and not ovs_bridge:
            fail("--ovs-rundir and --ovs-port need --ovs-bridge", code=EXIT_USAGE)
        if (nvue_user or nvue_password_file or nvue_ca) and not nvue:
            fail("--nvue-user, --nvue-password-file and --nvue-ca need --nvue", code=EXIT_USAGE)
        if (nvue_user is None) != (nvue_password_file is None):
            fail("give --nvue-user and --nvue-password-file together", code=EXIT_USAGE)
        ovs = OvsNode(ovs_bridge, ovs_rundir or SYSTEM_OVS_RUNDIR,
                      dict(p.split("=", 1) for p in ovs_port)) if ovs_bridge else None
        leaf = NvueLeaf(nvue, nvue_user, nvue_password_file, nvue_ca) if nvue else None

        if join_token and join_token_file:
            fail("give --join-token or --join-token-file, not both", code=EXIT_USAGE)
        token = join_token
        if join_token_file is not None:
            try:
                token = JOIN_TOKEN(join_token_file.read_text(encoding="utf-8"))
            except OSError as exc:
                fail(f"--join-token-file {join_token_file}: {exc.strerror}", code=EXIT_USAGE)
            except UnicodeDecodeError:
                fail(f"--join-token-file {join_token_file}: not UTF-8 text", code=EXIT_USAGE)
            except typer.BadParameter as exc:
                fail(f"--join-token-file {join_token_file}: {exc}", code=EXIT_USAGE)
        if metrics:  # before anything starts (and a join token is spent): one line naming the address
            host, _, port = metrics.rpartition(":")
            check_listen_address(host or "127.0.0.1", int(port))
        home = data_dir or Path(".trustfabric-agent") / node
        if not (home / BUNDLE_FILE).exists():  # with a stored bundle, an unusable --ca is only a fallback
            _check_ca(ca)
        logging.getLogger("trustfabric.agent").setLevel(logging.INFO)
        try:
            agent = Agent(AgentConfig(node=node, server=server, ca_file=ca, data_dir=home, join_token=token,
                                      socket=socket or home / "public" / "api.sock", metrics_addr=metrics,
                                      lab_home=lab, ovs=ovs, nvue=leaf, key_file=key_file)).start()
        except TrustfabricError as exc:
            fail(str(exc))
        signal.signal(signal.SIGTERM, lambda *_: agent.stop_event.set())
        typer.echo(f"agent {node}: {agent.identity.svid.spiffe_id if agent.identity.svid else '?'}; "
                   f"devices: {', '.join(x.device for x in agent.loops) or 'none'}; Workload API: "
                   f"{'SPIFFE_ENDPOINT_SOCKET=' + agent.workload_api.endpoint if agent.workload_api else 'off'}")
        try:
            agent.wait()
        except KeyboardInterrupt:
            pass
        finally:
            agent.stop()


def _check_ca(ca: Path) -> None:
    """One line and exit 1 when --ca holds no PEM certificate, before the data directory and key are made: it
    surfaced at the first request as `https://HOST:PORT: SSLError: no start line: cadata does not contain a
    certificate`, naming the server rather than the file."""
    import ssl

    try:
        ssl.create_default_context(cafile=str(ca))
    except (ssl.SSLError, ValueError):
        fail(f"--ca {ca}: no PEM certificate in it (`trustfabric bundle show --pem` writes the trust domain's roots)")
    except OSError as exc:
        fail(f"--ca {ca}: {exc.strerror or exc}")
