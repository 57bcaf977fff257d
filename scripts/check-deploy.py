#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""make check-deploy: the deployment examples in deploy/ without a cluster (no kubectl).

Every YAML file parses (python3-yaml); the Gateway API Inference Extension's InferencePool
has the fields its v1 schema requires and points at things that exist here: its selector
matches the ringlm pods, its target port is the gateway's container port, whose readiness is
/health, and its endpoint picker reference names a Service on that port that selects the
EPP; the pod's ringlmd and gateway share the emptyDir that holds the daemon's socket and
name the same served model. The systemd units name their binaries and, for the per-node
daemons, the node. Prints what is wrong and exits 1.
"""
import glob
import os
import re
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
errors = []


def err(where, msg):
    errors.append("%s: %s" % (os.path.relpath(where, ROOT), msg))


def args_of(container):
    out = {}
    for a in (container.get("command") or [])[1:] + (container.get("args") or []):
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            out.setdefault(k, []).append(v)
    return out


docs = []  # (path, document)
for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "**", "*.yaml"), recursive=True)):
    try:
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if d is not None:
                    docs.append((path, d))
    except yaml.YAMLError as e:
        err(path, "not valid YAML: %s" % e)
for path, d in docs:
    if not isinstance(d, dict) or "apiVersion" not in d or "kind" not in d:
        err(path, "a document without apiVersion and kind")

def find(kind, name=None):
    return [(p, d) for p, d in docs
            if isinstance(d, dict) and d.get("kind") == kind
            and (name is None or d.get("metadata", {}).get("name") == name)]


def pod_template(d):
    return d["spec"]["template"] if d["kind"] == "Deployment" else d


pools = find("InferencePool")
if not pools:
    err(os.path.join(ROOT, "deploy"), "no InferencePool")
for path, pool in pools:
    if pool.get("apiVersion") != "inference.networking.k8s.io/v1":
        err(path, "InferencePool apiVersion %r, not inference.networking.k8s.io/v1"
            % pool.get("apiVersion"))
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels")
    if not labels:
        err(path, "InferencePool spec.selector.matchLabels is required")
        continue
    ports = [p.get("number") for p in spec.get("targetPorts") or []]
    if not ports or len(ports) > 8 or len(set(ports)) != len(ports) or not all(
            isinstance(n, int) and 0 < n < 65536 for n in ports):
        err(path, "InferencePool spec.targetPorts: 1 to 8 unique port numbers, got %r" % ports)
        continue
    ref = spec.get("endpointPickerRef") or {}
    if not ref.get("name"):
        err(path, "InferencePool spec.endpointPickerRef.name is required")
    if ref.get("kind", "Service") == "Service" and not (ref.get("port") or {}).get("number"):
        err(path, "InferencePool spec.endpointPickerRef.port.number is required for a Service")
    if ref.get("failureMode", "FailClose") not in ("FailOpen", "FailClose"):
        err(path, "endpointPickerRef.failureMode %r" % ref.get("failureMode"))
    # the pods it selects: ringlm's, with the gateway on the target port
    members = [(p, d) for p, d in find("Deployment") + find("Pod")
               if all(pod_template(d).get("metadata", {}).get("labels", {}).get(k) == v
                      for k, v in labels.items())]
    if not members:
        err(path, "the selector %r matches no pod template in deploy/" % labels)
    for mp, m in members:
        pod = pod_template(m)["spec"]
        cs = {c["name"]: c for c in pod["containers"]}
        gw = [c for c in cs.values()
              if any(p.get("containerPort") == ports[0] for p in c.get("ports") or [])]
        if not gw:
            err(mp, "no container listens on the pool's target port %d" % ports[0])
            continue
        rp = ((gw[0].get("readinessProbe") or {}).get("httpGet") or {})
        if rp.get("path") != "/health" or rp.get("port") != ports[0]:
            err(mp, "the gateway's readiness is not GET /health on port %d" % ports[0])
        d_cs = [c for c in cs.values() if c.get("command", [""])[0].endswith("ringlmd")]
        if not d_cs:
            err(mp, "no ringlmd container beside the gateway")
            continue
        da, ga = args_of(d_cs[0]), args_of(gw[0])
        sock = (da.get("socket") or [""])[0]
        if (ga.get("socket") or [None])[0] != sock:
            err(mp, "the gateway's --socket is not the daemon's (%r)" % sock)
        empty = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        def mount_of(c):
            return [m["name"] for m in c.get("volumeMounts", [])
                    if sock.startswith(m["mountPath"].rstrip("/") + "/") and m["name"] in empty]
        if not mount_of(d_cs[0]) or mount_of(d_cs[0]) != mount_of(gw[0]):
            err(mp, "the daemon's socket %r is not on an emptyDir both containers mount" % sock)
        if da.get("served-model-name") != ga.get("served-model-name"):
            err(mp, "ringlmd and the gateway serve different model names: %r, %r"
                % (da.get("served-model-name"), ga.get("served-model-name")))
    # the endpoint picker: a Service on the referenced port that selects a Deployment
    svcs = find("Service", ref.get("name"))
    if not svcs:
        err(path, "no Service %r for the endpoint picker" % ref.get("name"))
    for sp, svc in svcs:
        if not any(p.get("port") == (ref.get("port") or {}).get("number")
                   for p in svc["spec"].get("ports", [])):
            err(sp, "the endpoint picker Service has no port %r" % ref.get("port"))
        sel = svc["spec"].get("selector") or {}
        if not any(all(pod_template(d).get("metadata", {}).get("labels", {}).get(k) == v
                       for k, v in sel.items()) for _, d in find("Deployment")):
            err(sp, "the endpoint picker Service selects no Deployment")
    for _, d in find("Deployment", ref.get("name")):
        args = [a for c in pod_template(d)["spec"]["containers"] for a in c.get("args", [])]
        if "--pool-name=%s" % pool["metadata"]["name"] not in args:
            err(path, "the endpoint picker is not given --pool-name=%s" % pool["metadata"]["name"])

for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "**", "*.service"), recursive=True)):
    text = open(path).read()
    if "[Service]" not in text or "ExecStart=" not in text:
        err(path, "a unit without [Service] ExecStart=")
    if os.path.basename(path).endswith("@.service") and "--numa-node %i" not in text:
        err(path, "a per-node template unit that does not pin its daemon to the node (%i)")

# A gateway over several daemons scrapes each one's metrics (its /metrics is the host as one
# server): a --daemon-metrics per --socket, at the port the per-node template gives that node.
template = os.path.join(ROOT, "deploy", "systemd", "ringlmd@.service")
m = re.search(r"--metrics\s+(\S+)%i", open(template).read()) if os.path.exists(template) else None
for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "**", "*.service"), recursive=True)):
    text = open(path).read()
    if "ringlm-gateway" not in text.split("ExecStart=", 1)[-1].split("\n", 1)[0]:
        continue
    nodes = re.findall(r"--socket\s+\S*ringlmd-(\d+)\.sock", text)
    if len(nodes) < 2:
        continue
    scraped = re.findall(r"--daemon-metrics\s+(\S+)", text)
    for n in nodes:
        want = (m.group(1) + n) if m else None
        if want not in scraped:
            err(path, "node %s's daemon has no --daemon-metrics %s: the gateway's /metrics "
                "would miss its queue and KV use" % (n, want))

for e in errors:
    print("check-deploy: " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
