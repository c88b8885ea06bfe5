"""deploy/k8s/*.yaml checked against the programs and each other
(check_references.py)."""
import json
import os
import re

import yaml

from refs_common import (IMAGE_UID, OUR_IMAGES, check_image, command_lines, image_repo_tag, port_of, spec_world)


# Kubernetes

def load_k8s(paths):
    objs = []
    for p in paths:
        with open(p) as f:
            for i, doc in enumerate(yaml.safe_load_all(f)):
                if doc:
                    objs.append((os.path.basename(p), doc))
    return json.loads(json.dumps(objs))


def pod_templates(objs):
    for fname, o in objs:
        kind = o.get("kind")
        if kind in ("StatefulSet", "Deployment", "DaemonSet", "ReplicaSet"):
            yield fname, o, o["spec"]["template"]
        elif kind == "Job":
            yield fname, o, o["spec"]["template"]


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_k8s(objs, progs, source_dir):
    problems = []
    pvcs = {o["metadata"]["name"]: o for _, o in objs if o.get("kind") == "PersistentVolumeClaim"}
    services = {o["metadata"]["name"]: o for _, o in objs if o.get("kind") == "Service"}
    pods = []  # facts per pod template

    for fname, o, tmpl in pod_templates(objs):
        w0 = f"{fname}: {o['kind']}/{o['metadata']['name']}"
        spec = tmpl.get("spec") or {}
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        sel = (o["spec"].get("selector") or {}).get("matchLabels")
        if o["kind"] != "Job" and not matches(sel, labels):
            problems.append(f"{w0}: selector {sel} does not match the template's labels")
        if o["kind"] == "StatefulSet" and o["spec"].get("serviceName") not in services:
            problems.append(f"{w0}: serviceName {o['spec'].get('serviceName')} is no Service here")
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        claim_templates = {c["metadata"]["name"] for c in o["spec"].get("volumeClaimTemplates") or []}
        for v in volumes.values():
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and claim not in pvcs:
                problems.append(f"{w0}: volume {v['name']}: no PersistentVolumeClaim {claim}")
        ctx = spec.get("securityContext") or {}
        if ctx.get("runAsUser") not in (None, IMAGE_UID) or not ctx.get("runAsNonRoot"):
            problems.append(f"{w0}: pod securityContext must be runAsNonRoot with the image's uid {IMAGE_UID}")
        facts = {"where": w0, "obj": o, "labels": labels, "ports": {}, "role": None, "values": {},
                 "mounts": {}, "containers": []}
        for kind in ("initContainers", "containers"):
            for c in spec.get(kind) or []:
                w = f"{w0}: {kind[:-1]} {c.get('name')}"
                image = c.get("image", "")
                problems += check_image(w, image)
                repo, _ = image_repo_tag(image)
                if repo in OUR_IMAGES and c.get("imagePullPolicy") != "IfNotPresent":
                    problems.append(f"{w}: imagePullPolicy {c.get('imagePullPolicy')} (IfNotPresent: a "
                                    f"loaded or versioned image is used as is)")
                res = c.get("resources") or {}
                for need in (("requests", "cpu"), ("requests", "memory"), ("limits", "memory")):
                    if need[1] not in (res.get(need[0]) or {}):
                        problems.append(f"{w}: no resources.{need[0]}.{need[1]}")
                mounts = {}
                for m in c.get("volumeMounts") or []:
                    if m["name"] not in volumes and m["name"] not in claim_templates:
                        problems.append(f"{w}: volumeMount {m['name']}: no such volume")
                    mounts[m["mountPath"]] = m["name"]
                env = {e["name"] for e in c.get("env") or []}
                argv = (c.get("command") or []) + (c.get("args") or [])
                resolved = []
                for a in argv:
                    for var in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                        if var not in env:
                            problems.append(f"{w}: $({var}) is not an env var of the container; "
                                            f"Kubernetes would pass it literally")
                    resolved.append(a.replace("$$", "$"))
                if repo in OUR_IMAGES and not argv:
                    problems.append(f"{w}: no command (the image's default is not a deployment's)")
                # named ports by name, unnamed ones by "#NUMBER"
                ports = {p.get("name") or f"#{p['containerPort']}": p["containerPort"] for p in c.get("ports") or []}
                for line in command_lines(resolved):
                    program, sub, values, positionals, p = progs.parse(line)
                    problems += [f"{w}: {x}" for x in p]
                    if kind == "containers":
                        role = {"shardtrain-coordinator": "coordinator",
                                "shardtrain-worker": "worker"}.get(program, "cli")
                        facts.update(role=role, values=values, positionals=positionals, sub=sub,
                                     container=c, mounts=mounts, where=w, volumes=volumes,
                                     claim_templates=claim_templates)
                if kind == "containers":
                    facts["ports"].update(ports)
                    facts["containers"].append(c)
        pods.append(facts)

    coordinators = [f for f in pods if f["role"] == "coordinator"]
    workers = [f for f in pods if f["role"] == "worker"]
    if len(coordinators) != 1:
        problems.append(f"k8s: expected one coordinator workload, found {len(coordinators)}")
    if not workers:
        problems.append("k8s: no worker workload")

    def port_number(facts, port):
        return facts["ports"].get(port) if isinstance(port, str) else port

    for f in coordinators + workers:
        w, c = f["where"], f["container"]
        metrics = port_of(f["values"].get("--metrics-listen"))
        if metrics not in f["ports"].values():
            problems.append(f"{w}: --metrics-listen port {metrics} is not a containerPort")
        for probe in ("readinessProbe", "livenessProbe"):
            get = (c.get(probe) or {}).get("httpGet")
            if not get:
                problems.append(f"{w}: no {probe} (httpGet /healthz)")
                continue
            if get.get("path") != "/healthz":
                problems.append(f"{w}: {probe} path {get.get('path')} is not /healthz")
            n = port_number(f, get.get("port"))
            if n is None:
                problems.append(f"{w}: {probe} port {get.get('port')} is no containerPort")
            elif n != metrics:
                problems.append(f"{w}: {probe} port {get.get('port')} ({n}) is not --metrics-listen's {metrics}")
    for f in coordinators:
        state = f["values"].get("--state-dir")
        if state not in f["mounts"]:
            problems.append(f"{f['where']}: --state-dir {state} is not a volume mount")
        for path, vol in f["mounts"].items():
            claim = (f["volumes"].get(vol, {}).get("persistentVolumeClaim") or {}).get("claimName")
            if claim and "ReadWriteMany" in pvcs.get(claim, {}).get("spec", {}).get("accessModes", []):
                problems.append(f"{f['where']}: the coordinator mounts the shared claim {claim}; it needs only its state")

    def coordinator_address(f):
        addr = f["values"].get("--coordinator")
        if not addr:
            problems.append(f"{f['where']}: no --coordinator")
            return
        host, _, port = addr.rpartition(":")
        svc = services.get(host)
        if not svc:
            problems.append(f"{f['where']}: --coordinator {addr}: no Service {host}")
            return
        if not coordinators or not matches(svc["spec"].get("selector"), coordinators[0]["labels"]):
            problems.append(f"{f['where']}: --coordinator {addr}: Service {host} does not select the coordinator")
            return
        sp = next((p for p in svc["spec"].get("ports") or [] if p.get("port") == int(port)), None)
        listen = port_of(coordinators[0]["values"].get("--listen"))
        if sp is None or port_number(coordinators[0], sp.get("targetPort", sp.get("port"))) != listen:
            problems.append(f"{f['where']}: --coordinator {addr}: Service port {port} does not lead to "
                            f"the coordinator's --listen port {listen}")

    shared = None
    cpu_ranks = 0
    for f in workers:
        w, c = f["where"], f["container"]
        coordinator_address(f)
        if "$(POD_IP)" not in (f["values"].get("--collective-address") or ""):
            problems.append(f"{w}: --collective-address is not the pod IP ($(POD_IP))")
        wd = c.get("workingDir")
        vol = f["mounts"].get(wd)
        claim = (f["volumes"].get(vol, {}).get("persistentVolumeClaim") or {}).get("claimName") if vol else None
        if not claim:
            problems.append(f"{w}: workingDir {wd} is not the mount point of a shared claim "
                            f"(a spec's relative data/ and ckpt/ paths must be shared)")
        else:
            if "ReadWriteMany" not in pvcs.get(claim, {}).get("spec", {}).get("accessModes", []):
                problems.append(f"{w}: claim {claim} is not ReadWriteMany: ranks on several nodes cannot share it")
            if shared is None:
                shared = (claim, wd)
            elif shared != (claim, wd):
                problems.append(f"{w}: mounts {claim} at {wd}; other workers {shared[0]} at {shared[1]}")
        device = f["values"].get("--device", "cpu")
        limits = (c.get("resources") or {}).get("limits") or {}
        if device.startswith("cuda"):
            if not limits.get("nvidia.com/gpu"):
                problems.append(f"{w}: --device {device} without a nvidia.com/gpu limit")
            if image_repo_tag(c["image"])[0] != "shardtrain-cuda":
                problems.append(f"{w}: --device {device} on image {c['image']}")
            if "/dev/shm" not in f["mounts"]:
                problems.append(f"{w}: no /dev/shm volume (NCCL needs more than 64 MiB)")
        else:
            if limits.get("nvidia.com/gpu"):
                problems.append(f"{w}: a CPU worker holding a GPU")
            cpus = str(limits.get("cpu", ""))
            threads = f["values"].get("--threads")
            if cpus and threads and re.fullmatch(r"\d+", cpus) and int(threads) > int(cpus):
                problems.append(f"{w}: --threads {threads} over its CPU limit {cpus}")
            cpu_ranks += int(f["obj"]["spec"].get("replicas", 1))

    for f in [p for p in pods if p["role"] == "cli"]:
        coordinator_address(f)
        if f.get("sub") == "submit" and f.get("positionals"):
            spec = f["positionals"][0]
            full = os.path.normpath(os.path.join(f["container"].get("workingDir", "/opt/shardtrain"), spec))
            local = os.path.join(source_dir, "examples", os.path.relpath(full, "/opt/shardtrain/examples"))
            if not full.startswith("/opt/shardtrain/examples/") or not os.path.exists(local):
                problems.append(f"{f['where']}: spec {spec} ({full}) is not one of examples/")
            else:
                world, device = spec_world(local)
                if device == "cpu" and world > cpu_ranks:
                    problems.append(f"{f['where']}: {spec} needs {world} CPU workers; the manifests run {cpu_ranks}")

    for name, svc in services.items():
        w = f"Service/{name}"
        selected = [p for p in pods if matches(svc["spec"].get("selector"), p["labels"])]
        if not selected:
            problems.append(f"{w}: selects no pod template")
        for sp in svc["spec"].get("ports") or []:
            target = sp.get("targetPort", sp.get("port"))
            for p in selected:
                if port_number(p, target) is None or (isinstance(target, int) and target not in p["ports"].values()):
                    problems.append(f"{w}: port {sp.get('name')} targets {target}, which {p['where']} does not expose")

    for _, o in objs:
        if o.get("kind") != "ServiceMonitor":
            continue
        w = f"ServiceMonitor/{o['metadata']['name']}"
        sel = (o["spec"].get("selector") or {}).get("matchLabels")
        chosen = [s for s in services.values() if matches(sel, s["metadata"].get("labels") or {})]
        if not chosen:
            problems.append(f"{w}: selects no Service")
        for ep in o["spec"].get("endpoints") or []:
            for s in chosen:
                if ep.get("port") not in [p.get("name") for p in s["spec"].get("ports") or []]:
                    problems.append(f"{w}: Service/{s['metadata']['name']} has no port named {ep.get('port')}")
            for r in ep.get("metricRelabelings") or []:
                if "exported_job" in str(r):
                    problems.append(f"{w}: metricRelabelings rule {r} names exported_job; "
                                    f"the programs label a training job job_id")
        for s in chosen:
            covered = [p for p in pods if matches(s["spec"].get("selector"), p["labels"])]
            if not covered:
                problems.append(f"{w}: Service/{s['metadata']['name']} selects no pods")
    return problems
