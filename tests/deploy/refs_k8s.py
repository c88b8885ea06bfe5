"""deploy/k8s/*.yaml checked against the programs and each other
(check_references.py).

shardtrain.yaml (one coordinator on SQLite) and shardtrain-ha.yaml (etcd and
coordinators that elect a leader on it) are alternatives, applied one or the
other: they share object names. Every other file goes with either, so the
objects are checked as one set per alternative (alternative_sets), each on its own."""
import json
import os
import re

import yaml

from refs_common import (IMAGE_UID, OUR_IMAGES, check_image, command_lines, etcd_flags, image_repo_tag,
                         port_of, spec_world)


# Kubernetes

# The files of deploy/k8s/ of which a user applies one; the rest go with each.
# A set is named by its alternative.
SINGLE_SET = "shardtrain.yaml"
HA_SET = "shardtrain-ha.yaml"
ALTERNATIVES = (SINGLE_SET, HA_SET)


def load_k8s(paths):
    objs = []
    for p in paths:
        with open(p) as f:
            for i, doc in enumerate(yaml.safe_load_all(f)):
                if doc:
                    objs.append((os.path.basename(p), doc))
    return json.loads(json.dumps(objs))


def alternative_sets(objs):
    """{alternative: [(file, object)]}: for each of ALTERNATIVES among the
    files, its objects and those of every file that is no alternative; all
    objects as one set "deploy/k8s" when there is none."""
    present = [a for a in ALTERNATIVES if any(f == a for f, _ in objs)]
    sets = {a: [(f, o) for f, o in objs if f == a or f not in ALTERNATIVES] for a in present}
    return sets or {"deploy/k8s": objs}


def check_k8s_sets(sets, progs, source_dir):
    """check_k8s on each set of alternative_sets; each problem starts with its set's
    name in brackets (a shared file's problem is reported once per set)."""
    problems = []
    for name, objs in sets.items():
        problems += [f"[{name}] {p}" for p in check_k8s(objs, progs, source_dir)]
    return problems


def selects(selector, labels):
    """A NetworkPolicy's matchLabels: empty (or absent) selects every pod."""
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def replica_count(o):
    """A workload's pods: its replicas (default 1); None for a DaemonSet (one per node)."""
    return None if o["kind"] == "DaemonSet" else int(o["spec"].get("replicas", 1))


def admitted(objs, source, target, port):
    """Whether the NetworkPolicies of objs let pods of facts `source` reach
    port `port` (a number) of pods of facts `target`: no policy selects the
    target for Ingress, or a rule of one that does admits source and port
    (a peer with a namespaceSelector is taken to admit it)."""
    policies = [o for _, o in objs if o.get("kind") == "NetworkPolicy"
                and selects((o["spec"].get("podSelector") or {}).get("matchLabels"), target["labels"])
                and "Ingress" in (o["spec"].get("policyTypes") or ["Ingress"])]
    if not policies:
        return True
    for o in policies:
        for rule in o["spec"].get("ingress") or []:
            peers = rule.get("from")
            if peers and not any("namespaceSelector" in p or ("podSelector" in p and selects(
                    p["podSelector"].get("matchLabels"), source["labels"])) for p in peers):
                continue
            ports = rule.get("ports")
            if not ports or any(p.get("port") is None or target["ports"].get(p["port"], p["port"]) == port
                                for p in ports):
                return True
    return False


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

    defined = {}
    for fname, o in objs:
        key = f"{o.get('kind')}/{o['metadata']['name']}"
        if key in defined:
            problems.append(f"{fname}: {key} is also defined in {defined[key]}; applied together, "
                            f"one replaces the other")
        defined.setdefault(key, fname)

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
                # env var -> the pod field it is (status.podIP, metadata.name), if it is one
                fields = {e["name"]: ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                          for e in c.get("env") or []}
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
                                     claim_templates=claim_templates, fields=fields)
                if kind == "containers" and argv and os.path.basename(argv[0]) == "etcd":
                    facts.update(role="etcd", values=etcd_flags(resolved), container=c, mounts=mounts,
                                 where=w, volumes=volumes, claim_templates=claim_templates, fields=fields)
                if kind == "containers":
                    facts["ports"].update(ports)
                    facts["containers"].append(c)
        pods.append(facts)

    coordinators = [f for f in pods if f["role"] == "coordinator"]
    workers = [f for f in pods if f["role"] == "worker"]
    etcds = [f for f in pods if f["role"] == "etcd"]
    if len(coordinators) != 1:
        problems.append(f"k8s: expected one coordinator workload, found {len(coordinators)}")
    if not workers:
        problems.append("k8s: no worker workload")

    def port_number(facts, port):
        return facts["ports"].get(port) if isinstance(port, str) else port

    def on_etcd(f):
        return f["role"] == "coordinator" and (f["values"].get("--state") or "").startswith("etcd://")

    for f in coordinators + workers:
        w, c = f["where"], f["container"]
        metrics = port_of(f["values"].get("--metrics-listen"))
        if metrics not in f["ports"].values():
            problems.append(f"{w}: --metrics-listen port {metrics} is not a containerPort")
        # On etcd a standby is alive but not Ready (/healthz is 503 off the
        # leader): a liveness probe on /healthz would restart every standby.
        paths = {"readinessProbe": "/healthz", "livenessProbe": "/livez" if on_etcd(f) else "/healthz"}
        for probe, path in paths.items():
            get = (c.get(probe) or {}).get("httpGet")
            if not get:
                problems.append(f"{w}: no {probe} (httpGet {path})")
                continue
            if get.get("path") != path:
                why = " (a standby is alive, not Ready)" if path == "/livez" else ""
                problems.append(f"{w}: {probe} path {get.get('path')} is not {path}{why}")
            n = port_number(f, get.get("port"))
            if n is None:
                problems.append(f"{w}: {probe} port {get.get('port')} is no containerPort")
            elif n != metrics:
                problems.append(f"{w}: {probe} port {get.get('port')} ({n}) is not --metrics-listen's {metrics}")

    def member_pods(e):
        """The pod names of etcd StatefulSet facts e."""
        return [f"{e['obj']['metadata']['name']}-{i}" for i in range(replica_count(e['obj']) or 0)]

    def check_etcd_coordinator(f, several):
        """--advertise, and every member of --state etcd://HOST:PORT,...[/PREFIX]
        a <pod>.<service> of an etcd StatefulSet here, its client port reachable."""
        w, values = f["where"], f["values"]
        adv = values.get("--advertise")
        if not adv:
            problems.append(f"{w}: on etcd without --advertise: a standby would name the leader by its "
                            f"--listen address {values.get('--listen')}")
        else:
            listen = port_of(values.get("--listen"))
            if port_of(adv) != listen:
                problems.append(f"{w}: --advertise {adv}: not --listen's port {listen}")
            own = ("status.podIP", "metadata.name") if f["obj"]["kind"] == "StatefulSet" else ("status.podIP",)
            if several and not any(f["fields"].get(v) in own for v in re.findall(r"\$\((\w+)\)", adv)):
                problems.append(f"{w}: --advertise {adv} is not the pod's own address (a $(VAR) from "
                                f"{' or '.join(own)}): every coordinator would name the same leader")
        scheme = "https" if values.get("--etcd-cacert") else "http"
        named = {}
        for hp in values["--state"][len("etcd://"):].split("/", 1)[0].split(","):
            host, _, port = hp.rpartition(":")
            pod, _, rest = host.partition(".")
            svc_name = rest.split(".")[0]
            svc = services.get(svc_name)
            e = next((x for x in etcds if x["obj"]["kind"] == "StatefulSet"
                      and x["obj"]["spec"].get("serviceName") == svc_name), None)
            if not svc or not e or not port.isdigit():
                problems.append(f"{w}: --state names {hp}, which is no <pod>.<service>:PORT of an etcd "
                                f"StatefulSet and its Service here")
                continue
            sts = e["obj"]["metadata"]["name"]
            if pod not in member_pods(e):
                problems.append(f"{w}: --state names {hp}: StatefulSet/{sts} has no pod {pod} "
                                f"(its pods: {', '.join(member_pods(e))})")
                continue
            named.setdefault(sts, (e, set()))[1].add(pod)
            if svc["spec"].get("clusterIP") != "None":
                problems.append(f"{w}: --state names {hp}: Service/{svc_name} is not headless "
                                f"(clusterIP: None), so {pod}.{svc_name} does not resolve")
            client = port_of((e["values"].get("--advertise-client-urls") or "").split(",")[0])
            sp = next((p for p in svc["spec"].get("ports") or [] if p.get("port") == int(port)), None)
            if sp is None or port_number(e, sp.get("targetPort", sp.get("port"))) != client:
                problems.append(f"{w}: --state names {hp}: Service/{svc_name} has no port {port} leading "
                                f"to the members' client port {client}")
            elif not admitted(objs, f, e, client):
                problems.append(f"{w}: --state names {hp}: a NetworkPolicy keeps the coordinator from "
                                f"its client port {client}")
            urls = e["values"].get("--advertise-client-urls") or ""
            if not urls.startswith(scheme + "://"):
                problems.append(f"{w}: --state names {hp}: StatefulSet/{sts} advertises {urls}, the "
                                f"coordinator speaks {scheme} ({'with' if scheme == 'https' else 'without'} "
                                f"--etcd-cacert)")
        for sts, (e, pods_named) in named.items():
            left = [p for p in member_pods(e) if p not in pods_named]
            if left:
                problems.append(f"{w}: --state leaves out {left} of StatefulSet/{sts}: name every member, "
                                f"so that any majority of them serves the coordinator")

    def spread(f, count):
        """Several pods of one workload (`count` says how many) must prefer
        (or need) distinct nodes."""
        tmpl_spec = f["obj"]["spec"]["template"].get("spec") or {}
        anti = (tmpl_spec.get("affinity") or {}).get("podAntiAffinity") or {}
        terms = [t.get("podAffinityTerm") or {} for t in
                 anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []]
        terms += anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
        if not any(t.get("topologyKey") == "kubernetes.io/hostname"
                   and matches((t.get("labelSelector") or {}).get("matchLabels"), f["labels"]) for t in terms):
            problems.append(f"{f['where']}: {count} and no podAntiAffinity on kubernetes.io/hostname "
                            f"for its own pods: they may share a node, and losing it loses them all")

    # --leader-ttl-s's default, from --help ("INT:INT in [1 - 600]=5")
    m = re.search(r"=(\d+)$", progs.usage("shardtrain-coordinator").options
                  .get("--leader-ttl-s", {}).get("type", "")) if coordinators else None
    ttl_default = int(m.group(1)) if m else 5
    for f in coordinators:
        w, o, c = f["where"], f["obj"], f["container"]
        n = replica_count(o)
        several = n is None or n > 1
        replicas = "one per node" if n is None else f"{n} replicas"
        if not on_etcd(f):
            if several:
                problems.append(f"{w}: {replicas} on SQLite (--state {f['values'].get('--state', 'sqlite')}): "
                                f"each would lead alone on a state of its own; several coordinators need "
                                f"--state etcd://...")
            state = f["values"].get("--state-dir")
            if state not in f["mounts"]:
                problems.append(f"{w}: --state-dir {state} is not a volume mount")
        else:
            check_etcd_coordinator(f, several)
        if several:
            spread(f, replicas)
            if o["kind"] == "StatefulSet":
                problems.append(f"{w}: a StatefulSet of several coordinators: its rolling update waits for "
                                f"each new pod to be Ready, which a standby never is (a Deployment with "
                                f"maxUnavailable 100%)")
            strategy = o["spec"].get("strategy") or {}
            if o["kind"] == "Deployment" and strategy.get("type", "RollingUpdate") == "RollingUpdate":
                mu = (strategy.get("rollingUpdate") or {}).get("maxUnavailable", "25%")
                m = re.fullmatch(r"(\d+)%", str(mu))
                stops = int(m.group(1)) * n // 100 if m else int(mu)  # percentages round down
                if stops < n:
                    problems.append(f"{w}: strategy maxUnavailable {mu} of {n} replicas: the rolling update "
                                    f"waits for new coordinators to be Ready, which a standby never is, so it "
                                    f"stalls (maxUnavailable: 100% or {n}, or type Recreate)")
            if on_etcd(f):
                # Ready = leading: the probe's pace is how late the Service
                # follows a change of leader.
                ready = c.get("readinessProbe") or {}
                period = int(ready.get("periodSeconds", 10))
                late = period * max(int(ready.get("failureThreshold", 3)), int(ready.get("successThreshold", 1)))
                ttl = int(f["values"].get("--leader-ttl-s") or ttl_default)
                if late > ttl:
                    problems.append(f"{w}: readinessProbe every {period} s: the Service would follow a change "
                                    f"of leader up to {late} s late, longer than the election itself "
                                    f"(--leader-ttl-s {ttl})")
        for path, vol in f["mounts"].items():
            claim = (f["volumes"].get(vol, {}).get("persistentVolumeClaim") or {}).get("claimName")
            if claim and "ReadWriteMany" in pvcs.get(claim, {}).get("spec", {}).get("accessModes", []):
                problems.append(f"{f['where']}: the coordinator mounts the shared claim {claim}; it needs only its state")

    # etcd members: a StatefulSet whose pods find each other by name.
    for e in etcds:
        w, o, v = e["where"], e["obj"], e["values"]
        if o["kind"] != "StatefulSet":
            problems.append(f"{w}: etcd members need stable names and a volume each: a StatefulSet, not a {o['kind']}")
            continue
        n, members = replica_count(o), member_pods(e)
        svc_name = o["spec"].get("serviceName")
        svc = services.get(svc_name) or {"spec": {}}
        if svc["spec"].get("clusterIP") != "None":
            problems.append(f"{w}: Service/{svc_name} is not headless (clusterIP: None): the members' names "
                            f"<pod>.{svc_name} do not resolve")
        if not svc["spec"].get("publishNotReadyAddresses"):
            problems.append(f"{w}: Service/{svc_name} lacks publishNotReadyAddresses: true; a member is Ready "
                            f"once it has found the others by name, which do not resolve before")
        if n > 1 and o["spec"].get("podManagementPolicy", "OrderedReady") != "Parallel":
            problems.append(f"{w}: podManagementPolicy {o['spec'].get('podManagementPolicy', 'OrderedReady')}: "
                            f"member 0 waits to be Ready, which needs a majority not yet started (Parallel)")
        if n % 2 == 0:
            problems.append(f"{w}: {n} members survive no more failures than {n - 1} (an odd number)")
        if n > 1:
            spread(e, f"{n} replicas")
        name = v.get("--name") or ""
        m = re.fullmatch(r"\$\((\w+)\)", name)
        if not m or e["fields"].get(m.group(1)) != "metadata.name":
            problems.append(f"{w}: --name {name!r} is not the pod's name (a $(VAR) from metadata.name), "
                            f"which --initial-cluster lists")
            continue
        for flag, listen_flag in (("--initial-advertise-peer-urls", "--listen-peer-urls"),
                                  ("--advertise-client-urls", "--listen-client-urls")):
            url = v.get(flag) or ""
            um = re.fullmatch(r"(https?)://([^:/,]+):(\d+)", url)
            if not um or um.group(2).split(".")[:2] != [name, svc_name]:
                problems.append(f"{w}: {flag} {url!r} is not one URL of the member's own name "
                                f"{name}.{svc_name}:PORT")
                continue
            port = int(um.group(3))
            if port not in e["ports"].values():
                problems.append(f"{w}: {flag} port {port} is no containerPort")
            if port not in [port_of(u) for u in (v.get(listen_flag) or "").split(",")]:
                problems.append(f"{w}: {flag} port {port} is not a port of {listen_flag}")
        peer = v.get("--initial-advertise-peer-urls") or ""
        wanted = {f"{p}={peer.replace(name, p)}" for p in members}
        got = {x for x in (v.get("--initial-cluster") or "").split(",") if x}
        if got != wanted:
            problems.append(f"{w}: --initial-cluster does not name exactly its {n} replicas' peer URLs "
                            f"(missing {sorted(wanted - got)}, not members {sorted(got - wanted)})")
        peer_port = port_of(peer)
        if peer_port and not admitted(objs, e, e, peer_port):
            problems.append(f"{w}: a NetworkPolicy keeps the members from each other's peer port {peer_port}")
        data = v.get("--data-dir")
        vol = e["mounts"].get(data)
        claim = vol in e["claim_templates"] or (e["volumes"].get(vol) or {}).get("persistentVolumeClaim")
        if not claim:
            problems.append(f"{w}: --data-dir {data} is not the mount point of a volume claim: a restarted "
                            f"member would come back empty")

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
        if svc["spec"].get("publishNotReadyAddresses") and any(on_etcd(p) for p in selected):
            problems.append(f"{w}: publishNotReadyAddresses: it would lead to standby coordinators, "
                            f"which are not Ready by design")

    for _, o in objs:
        if o.get("kind") != "NetworkPolicy":
            continue
        w = f"NetworkPolicy/{o['metadata']['name']}"
        targets = [p for p in pods if selects((o["spec"].get("podSelector") or {}).get("matchLabels"), p["labels"])]
        if not targets:
            problems.append(f"{w}: selects no pod template")
        for rule in o["spec"].get("ingress") or []:
            for port in rule.get("ports") or []:
                for t in targets:
                    if isinstance(port.get("port"), str) and port["port"] not in t["ports"]:
                        problems.append(f"{w}: port {port['port']} is no port of {t['where']}")
            for peer in rule.get("from") or []:
                sel = (peer.get("podSelector") or {}).get("matchLabels")
                if sel and "namespaceSelector" not in peer and not any(matches(sel, p["labels"]) for p in pods):
                    problems.append(f"{w}: from podSelector {sel} selects no pod template")

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
