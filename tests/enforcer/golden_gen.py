"""The golden outputs of the small example fabric, in every format.

Regenerate after an intended change and review the diff before committing:
    .venv/bin/python -m tests.enforcer.golden_gen
"""

from __future__ import annotations

import json

from enforcer.render.linux import render_linux
from enforcer.render.nvue import nv_set_commands, nvue_yaml
from enforcer.render.openflow import render_openflow
from tests.enforcer.helpers import GOLDEN, compile_small


def render_all() -> dict[str, str]:
    """relative path -> content."""
    compiled, _ = compile_small()
    out: dict[str, str] = {}
    for _device, rs in sorted(compiled.devices.items()):
        name = rs.name
        out[f"ir/{rs.kind}-{name}.json"] = json.dumps(rs.to_dict(), indent=1, sort_keys=True) + "\n"
        if rs.kind == "nic":
            out[f"openflow/{name}.flows"] = render_openflow(rs)
        else:
            out[f"nvue/{name}.yaml"] = nvue_yaml(rs)
            out[f"nvue/{name}.nv-set.txt"] = "\n".join(nv_set_commands(rs)) + "\n"
            linux = render_linux(rs, compiled.fabric)
            out[f"linux/{name}.nft.json"] = json.dumps(linux.nft, indent=1) + "\n"
            out[f"linux/{name}.routing.json"] = json.dumps(
                {"ip_rules": list(linux.ip_rules), "routes": list(linux.routes), "sets": linux.set_names},
                indent=1, sort_keys=True) + "\n"
    return out


def main() -> None:
    for rel, text in render_all().items():
        path = GOLDEN / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(path.relative_to(GOLDEN.parents[2]))


if __name__ == "__main__":
    main()
