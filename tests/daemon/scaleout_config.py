#!/usr/bin/python3
"""The scale-out examples agree with the daemon: the Kubernetes manifests in
etc/kubernetes parse (python3-yaml), fit together (labels, ports, the
ConfigMap the Deployment mounts) and fit resnetd's configuration (the
ConfigMap passes --check-config; the grace period outlasts the preStop
sleep plus the drain; probes on the v2 health paths), and etc/nginx's
limits and timeouts match the daemon's defaults, read from resnetd --help.

Usage: scaleout_config.py SRCDIR RESNETD
Prints one line per check; exits 0 when all pass, 1 otherwise.
"""

import os
import re
import subprocess
import sys
import tempfile

import yaml

SRC, RESNETD = sys.argv[1], sys.argv[2]
K8S = os.path.join(SRC, "etc", "kubernetes")
NGINX = os.path.join(SRC, "etc", "nginx", "resnetd.conf")


def size(v):
    m = re.fullmatch(r"(\d+)([kKmMgG]?)", v.strip())
    assert m, v
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def defaults():
    """Option -> default, from resnetd --help."""
    out = subprocess.run([RESNETD, "--help"], capture_output=True, text=True).stdout
    found = dict(re.findall(r"--([a-z0-9-]+)=VALUE\n.*\(default: ([^)]*)\)", out))
    assert "drain-timeout-ms" in found, out[:500]
    return {k.replace("-", "_"): v for k, v in found.items()}


def seconds(v):
    m = re.fullmatch(r"(\d+)(ms|s|m)?", v)
    assert m, v
    return int(m.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60}[m.group(2)]


def load_manifests():
    """Kind -> [(file, document)] for every YAML file in etc/kubernetes."""
    docs = {}
    files = sorted(f for f in os.listdir(K8S) if f.endswith(".yaml"))
    for f in files:
        text = open(os.path.join(K8S, f)).read()
        for line in text.splitlines():
            # Options live in prose (README.md), not in commented-out YAML.
            assert not re.match(r"\s*#\s*-?\s*[A-Za-z0-9_./-]+:(\s|$)", line), "%s: commented-out YAML: %r" % (f, line)
        for d in yaml.safe_load_all(text):
            assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind"), (f, d)
            docs.setdefault(d["kind"], []).append((f, d))
    return docs


def check_manifests_parse(docs):
    files = sorted(f for f in os.listdir(K8S) if f.endswith(".yaml"))
    kust = docs["Kustomization"][0][1]
    listed = sorted(kust["resources"])
    assert listed == sorted(f for f in files if f != "kustomization.yaml"), (listed, files)
    for kind in ("ConfigMap", "Deployment", "Service"):
        assert len(docs.get(kind, [])) == 1, (kind, docs.keys())
    assert docs.get("PodMonitor") or docs.get("ServiceMonitor"), docs.keys()
    return "%d files: %s" % (len(files), ", ".join(sorted(k for k in docs if k != "Kustomization")))


def config_of(docs):
    cm = docs["ConfigMap"][0][1]
    text = cm["data"]["resnetd.conf"]
    opts = dict(defaults())
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            k, _, v = line.partition("=")
            opts[k.strip()] = v.strip()
    return cm, text, opts


def check_configmap_is_a_valid_config(docs):
    _, text, opts = config_of(docs)
    with tempfile.NamedTemporaryFile("w", suffix=".conf") as f:
        f.write(text)
        f.flush()
        # The weights are the image's: synthetic ones stand in for them here.
        p = subprocess.run([RESNETD, "--config", f.name, "--weights", "synthetic", "--check-config"],
                           capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return "listen %s, drain_timeout_ms %s" % (opts["listen"], opts["drain_timeout_ms"])


def check_deployment_fits_the_config(docs):
    cm, _, opts = config_of(docs)
    dep = docs["Deployment"][0][1]
    pod = dep["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), (dep["spec"]["selector"], labels)
    spec = pod["spec"]
    (c,) = spec["containers"]
    port = int(opts["listen"].rsplit(":", 1)[1])
    assert opts["listen"].startswith("0.0.0.0:") or opts["listen"].startswith("[::]:"), opts["listen"]
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named.get("http") == port, (named, port)
    # The ConfigMap is what the daemon reads.
    conf = c["args"][c["args"].index("--config") + 1]
    mount = [m for m in c["volumeMounts"] if os.path.dirname(conf) == m["mountPath"].rstrip("/")]
    assert mount, (conf, c["volumeMounts"])
    vol = [v for v in spec["volumes"] if v["name"] == mount[0]["name"]][0]
    assert vol["configMap"]["name"] == cm["metadata"]["name"], vol
    assert os.path.basename(conf) in cm["data"], conf
    for probe, path in (("livenessProbe", "/v2/health/live"), ("readinessProbe", "/v2/health/ready")):
        got = c[probe]["httpGet"]
        assert got["path"] == path and got["port"] in ("http", port), (probe, got)
    # SIGKILL must not cut the drain short.
    sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = spec["terminationGracePeriodSeconds"]
    drain_s = int(opts["drain_timeout_ms"]) / 1000
    assert grace > sleep + drain_s, "terminationGracePeriodSeconds %s <= preStop %s s + drain %s s" % (
        grace, sleep, drain_s)
    res = c["resources"]
    for k in ("cpu", "memory"):
        assert k in res["requests"] and k in res["limits"], res
    assert size(res["limits"]["memory"].replace("i", "")) > size(opts["body_memory_bytes"]), (
        res["limits"]["memory"], opts["body_memory_bytes"])
    return "grace %d s > preStop %d s + drain %g s; port %d; probes on /v2/health" % (grace, sleep, drain_s, port)


def check_service_and_monitor_select_the_pods(docs):
    dep = docs["Deployment"][0][1]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    svc = docs["Service"][0][1]
    assert svc["spec"]["selector"].items() <= labels.items(), svc["spec"]["selector"]
    assert all(p["targetPort"] in ports for p in svc["spec"]["ports"]), svc["spec"]["ports"]
    if docs.get("PodMonitor"):
        mon = docs["PodMonitor"][0][1]
        eps = mon["spec"]["podMetricsEndpoints"]
        assert mon["spec"]["selector"]["matchLabels"].items() <= labels.items(), mon["spec"]["selector"]
    else:
        mon = docs["ServiceMonitor"][0][1]
        eps = mon["spec"]["endpoints"]
        assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert all(e["port"] in ports and e.get("path", "/metrics") == "/metrics" for e in eps), eps
    return ""


def check_nginx_matches_the_daemon(docs):
    d = defaults()
    text = open(NGINX).read()

    def directive(name):
        vals = re.findall(r"^\s*%s\s+([^;]+);" % name, text, re.M)
        assert len(vals) == 1, (name, vals)
        return vals[0].strip()

    assert size(directive("client_max_body_size")) == size(d["max_body_bytes"]), (
        directive("client_max_body_size"), d["max_body_bytes"])
    # The daemon's own 504 comes first; nginx drops an idle upstream
    # connection before the daemon closes it.
    assert seconds(directive("proxy_read_timeout")) > int(d["request_timeout_ms"]) / 1000, (
        directive("proxy_read_timeout"), d["request_timeout_ms"])
    assert seconds(directive("keepalive_timeout")) < int(d["header_timeout_s"]), (
        directive("keepalive_timeout"), d["header_timeout_s"])
    assert seconds(directive("client_header_timeout")) <= int(d["header_timeout_s"]), (
        directive("client_header_timeout"), d["header_timeout_s"])
    port = d["listen"].rsplit(":", 1)[1]
    servers = re.findall(r"^\s*server\s+([^\s{;]+)[^{;]*;", text, re.M)
    assert servers and all(s.endswith(":" + port) for s in servers), servers
    assert re.search(r"^\s*least_conn;", text, re.M), "no least_conn"
    nu = directive("proxy_next_upstream").split()
    assert {"error", "http_503", "non_idempotent"} <= set(nu), nu
    return "body %s, read timeout %s > %s ms, upstream keepalive %s < %s s" % (
        directive("client_max_body_size"), directive("proxy_read_timeout"), d["request_timeout_ms"],
        directive("keepalive_timeout"), d["header_timeout_s"])


def main():
    failed = 0
    try:
        docs = load_manifests()
    except Exception as e:
        print("FAIL %-40s %r" % ("manifests_load", e))
        return 1
    for fn in (check_manifests_parse, check_configmap_is_a_valid_config, check_deployment_fits_the_config,
               check_service_and_monitor_select_the_pods, check_nginx_matches_the_daemon):
        name = fn.__name__[len("check_"):]
        try:
            note = fn(docs)
            print("ok   %-40s %s" % (name, note or ""))
        except Exception as e:
            failed += 1
            print("FAIL %-40s %r" % (name, e))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
