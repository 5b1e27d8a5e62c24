"""Lab set-up for tests with the real gateway: routes between lab hosts, engines as plain units, the gateway role.

Lab hosts reach only the machine that runs them (each has a point-to-point link, ``ve-NAMEi`` outside,
``host0`` inside). A gateway on one host must reach the engines on the others, so :func:`connect_hosts` gives
each host a route to the lab's /24 through its peer address, and turns on IPv4 forwarding on the lab's own
``ve-NAMEi`` links (per link: nothing else on the machine forwards, and the setting goes with the link at
``lab down``).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

import yaml
from labutil import install_unit, sh, wait_healthy

REPO = Path(__file__).resolve().parents[2]
LAB_INVENTORY = REPO / "tests" / "lab" / "inventory"
GATEWAY_PLAY = REPO / "tests" / "e2e" / "playbooks" / "sglang_gateway.yml"
ENGINE_UNIT = "t-engine.service"
ENGINE_PORT = 30000
GATEWAY_PORT = 30080
GATEWAY_UNIT = "sglang-gateway.service"
MODEL = "Qwen/Qwen3-8B"

ENGINE_UNIT_TEXT = """\
[Unit]
Description=Simulated SGLang engine behind the gateway
[Service]
Environment=SGLANG_SIM_DRAIN_TIME=10
Environment=PATH=/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin
ExecStart=/opt/sglang/venv/bin/python -m sglang_sim.launch_server --model-path {model} --tp-size 1 \
 --host 0.0.0.0 --port {port} --api-key {api_key} --enable-metrics --sim-load-time 0.5 --sim-warmup-time 0.2 \
 --sim-token-latency-ms 5
KillMode=control-group
TimeoutStopSec=30
"""


def addresses(lab) -> dict:
    """Each lab host's address, from the inventory ``lab up`` wrote."""
    inventory = yaml.safe_load(Path(lab.inventory).read_text())
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    return {name: hosts[name]["ansible_host"] for name in lab.hosts}


def connect_hosts(lab) -> dict:
    """Route the lab's hosts to each other through the machine that runs them; return their addresses."""
    found = addresses(lab)
    for host, address in found.items():
        peer = str(ipaddress.ip_address(address) - 1)
        subnet = str(ipaddress.ip_network(f"{address}/24", strict=False))
        sh(lab, host, f"ip route replace {subnet} via {peer} dev host0")
        link = f"ve-{host}"
        Path(f"/proc/sys/net/ipv4/conf/{link}/forwarding").write_text("1\n")
    for host in found:
        for other, address in found.items():
            if other != host:
                probe = f"import socket; socket.create_connection(('{address}', 22), 3).close()"
                sh(lab, host, f'python3 -c "{probe}" || (echo "{host}: no route to {other} ({address})"; exit 1)')
    return found


def worker_url(address: str) -> str:
    return f"http://{address}:{ENGINE_PORT}"


def gateway_url(address: str) -> str:
    return f"http://{address}:{GATEWAY_PORT}"


def start_engine(lab, host: str, api_key: str) -> None:
    install_unit(lab, host, ENGINE_UNIT, ENGINE_UNIT_TEXT.format(model=MODEL, port=ENGINE_PORT, api_key=api_key))
    sh(lab, host, f"systemctl restart {ENGINE_UNIT}")
    wait_healthy(lab, host, ENGINE_PORT, timeout=60)


def apply_gateway_role(
    lab, hosts: str, extra_vars: dict | None = None, check: bool = False, diff: bool = False, tags: str = ""
) -> subprocess.CompletedProcess:
    """Run the role through tests/e2e/playbooks/sglang_gateway.yml with the lab's inventory variables."""
    cmd = ["ansible-playbook", "-i", str(lab.inventory), "-i", str(LAB_INVENTORY), str(GATEWAY_PLAY),
           "-e", json.dumps({"gateway_test_hosts": hosts, **(extra_vars or {})})]  # fmt: skip
    cmd += ["--check"] if check else []
    cmd += ["--diff"] if diff else []
    cmd += ["--tags", tags] if tags else []
    return subprocess.run(cmd, capture_output=True, text=True, env=lab.env(), timeout=900, check=False)


def main_pid(lab, host: str, unit: str = GATEWAY_UNIT) -> int:
    return int(sh(lab, host, f"systemctl show -p MainPID --value {unit}").strip())


def unit_properties(lab, host: str, names: list, unit: str = GATEWAY_UNIT) -> dict:
    out = sh(lab, host, f"systemctl show {unit} " + " ".join(f"-p {name}" for name in names))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def gateway_workers(lab, host: str, api_key: str) -> list:
    """What the gateway on ``host`` lists, read on that host."""
    script = (
        "import urllib.request\n"
        f"request = urllib.request.Request('http://127.0.0.1:{GATEWAY_PORT}/workers', "
        f"headers={{'Authorization': 'Bearer {api_key}'}})\n"
        "print(urllib.request.urlopen(request, timeout=5).read().decode())\n"
    )
    out = sh(lab, host, f"python3 - <<'EOF'\n{script}EOF")
    return [(worker["url"], worker.get("status"), worker.get("is_healthy")) for worker in json.loads(out)["workers"]]


def recap(proc: subprocess.CompletedProcess) -> dict:
    """``{host: {"ok": n, "changed": n, "failed": n, ...}}`` from a playbook's PLAY RECAP."""
    totals = {}
    lines = proc.stdout.splitlines()
    if "PLAY RECAP" not in proc.stdout:
        return totals
    for line in lines[[index for index, text in enumerate(lines) if text.startswith("PLAY RECAP")][-1] + 1 :]:
        if ":" not in line:
            continue
        host, counts = line.split(":", 1)
        totals[host.strip()] = {key: int(value) for key, value in (item.split("=") for item in counts.split())}
    return totals
