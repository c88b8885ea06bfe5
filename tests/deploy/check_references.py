#!/usr/bin/env python3
"""Checks that deploy/ agrees with the programs and with itself.

Every shardtrain command line in deploy/docker-compose.yml and deploy/k8s/*.yaml
is parsed against the real flags of the built programs (their --help: unknown
flags, missing values, required options, value ranges and choices), and every
reference resolves: volumes are declared, probe and healthcheck ports are the
--metrics-listen port, --coordinator names the coordinator's service and gRPC
port, $(VAR) names an env var of its container, Services and the ServiceMonitor
select pods with the ports they name, Prometheus scrapes the ports the
programs serve, the Grafana dashboard's metrics are exported by the programs,
and the storage rule holds (every worker mounts the one shared volume at its
working directory; the coordinator mounts only its state). deploy/Dockerfile
builds only the three programs, runs as the uid the manifests use and creates
the paths they mount.

  check_references.py --source-dir DIR --bin-dir DIR [--self-test]

--self-test breaks the files in memory in known ways and requires each break
to be reported. Prints one line per problem; exits 1 if there are any.
Needs PyYAML (Debian's python3-yaml).
"""
import argparse
import copy
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import yaml

PROGRAMS = ("shardtrain", "shardtrain-coordinator", "shardtrain-worker")
OUR_IMAGES = ("shardtrain", "shardtrain-cuda")
IMAGE_UID = 10001


# ---------------------------------------------------------------------------
# The programs' flags, from --help (CLI11's format).

class Usage:
    """One program's (or subcommand's) options and positionals."""

    def __init__(self, text):
        self.options = {}        # name -> {"value": bool, "type": str, "repeat": bool}
        self.required = set()    # option names that are REQUIRED
        self.positionals = []    # [(name, required, repeat)]
        self.subcommands = set()
        section = None
        for line in text.splitlines():
            if re.match(r"^(Options|Positionals|Subcommands):", line):
                section = line.split(":")[0]
                continue
            if not line.startswith("  ") or line.startswith("   "):
                continue  # a wrapped description
            head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            parts = head.split()
            if section == "Options" and parts[0].startswith("-"):
                names = parts[0].split(",")
                rest = " ".join(parts[1:])
                typ = parts[1] if len(parts) > 1 and re.match(r"^[A-Z]", parts[1]) else ""
                spec = {"value": bool(typ), "type": rest, "repeat": "..." in parts}
                for n in names:
                    self.options[n] = spec
                    if "REQUIRED" in parts:
                        self.required.add(names[-1])
            elif section == "Positionals":
                self.positionals.append((parts[0], "REQUIRED" in parts, "..." in parts))
            elif section == "Subcommands":
                self.subcommands.add(parts[0])


class Programs:
    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.cache = {}

    def usage(self, program, sub=None):
        key = (program, sub)
        if key not in self.cache:
            argv = [os.path.join(self.bin_dir, program)] + ([sub] if sub else []) + ["--help"]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            if out.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr}")
            self.cache[key] = Usage(out.stdout)
        return self.cache[key]

    def parse(self, argv):
        """Returns (program, subcommand, {option: value}, [positionals], [problems])."""
        problems = []
        program = os.path.basename(argv[0])
        args = list(argv[1:])
        sub = None
        if program == "shardtrain":
            top = self.usage(program)
            if not args or args[0] not in top.subcommands:
                return program, None, {}, [], [f"shardtrain: no known subcommand in {args[:1]} "
                                               f"({', '.join(sorted(top.subcommands))})"]
            sub = args.pop(0)
        usage = self.usage(program, sub)
        values, positionals = {}, []
        name = f"{program} {sub}" if sub else program
        i = 0
        while i < len(args):
            a = args[i]
            i += 1
            if a.startswith("-") and len(a) > 1:
                flag, eq, val = a.partition("=")
                spec = usage.options.get(flag)
                if spec is None:
                    problems.append(f"{name}: unknown flag {flag} (has {', '.join(sorted(o for o in usage.options if o.startswith('--')))})")
                    continue
                canonical = next(o for o, s in usage.options.items() if s is spec and o.startswith("--")) \
                    if not flag.startswith("--") else flag
                if spec["value"]:
                    if not eq:
                        if i >= len(args) or args[i].startswith("--"):
                            problems.append(f"{name}: {flag} needs a value")
                            continue
                        val = args[i]
                        i += 1
                    problems += check_value(name, flag, spec["type"], val)
                    values[canonical] = val
                else:
                    if eq:
                        problems.append(f"{name}: {flag} takes no value")
                    values[canonical] = True
            else:
                positionals.append(a)
        for req in usage.required:
            if req not in values:
                problems.append(f"{name}: required option {req} missing")
        wanted = [p for p in usage.positionals if p[1]]
        if len(positionals) < len(wanted):
            problems.append(f"{name}: missing positional {wanted[len(positionals)][0]}")
        if not any(p[2] for p in usage.positionals) and len(positionals) > len(usage.positionals):
            problems.append(f"{name}: unexpected argument(s) {positionals[len(usage.positionals):]}")
        return program, sub, values, positionals, problems


def check_value(name, flag, typ, val):
    if "$(" in val or "${" in val:  # filled in at run time (shell or Kubernetes)
        return []
    m = re.match(r"^INT(?::INT in \[(-?\d+) - (-?\d+)\])?", typ)
    if m:
        if not re.fullmatch(r"-?\d+", val):
            return [f"{name}: {flag} {val!r} is not an integer"]
        if m.group(1) and not int(m.group(1)) <= int(val) <= int(m.group(2)):
            return [f"{name}: {flag} {val} outside [{m.group(1)}, {m.group(2)}]"]
    m = re.match(r"^TEXT:\{([^}]*)\}", typ)
    if m and val not in m.group(1).split(","):
        return [f"{name}: {flag} {val!r} is not one of {m.group(1)}"]
    return []


def port_of(address):
    """'0.0.0.0:9091' -> 9091; None if there is no numeric port."""
    m = re.search(r":(\d+)$", address or "")
    return int(m.group(1)) if m else None


def command_lines(argv):
    """The shardtrain command lines in a container's argv: the argv itself, or
    the commands of a `sh -c SCRIPT` (after `exec`, up to a shell operator)."""
    if not argv:
        return []
    if os.path.basename(argv[0]) in ("sh", "bash") and len(argv) >= 3 and argv[1] == "-c":
        # A command substitution, quoted or not, is one word to the shell.
        script = re.sub(r'"?\$\([^()]*\)"?', "$(SUBST)", argv[2])
        tokens = shlex.split(script, posix=True)
        lines, cur = [], None
        for t in tokens:
            if t in ("&&", "||", ";", "|") or t.startswith((">", "<", "2>")) or t.endswith(";"):
                if cur:
                    lines.append(cur)
                cur = None
                continue
            if cur is None and os.path.basename(t) in PROGRAMS:
                cur = [t]
            elif cur is not None:
                cur.append(t)
        if cur:
            lines.append(cur)
        return lines
    return [argv] if os.path.basename(argv[0]) in PROGRAMS else []


def spec_world(path):
    with open(path) as f:
        spec = yaml.safe_load(f)
    par = spec.get("parallel") or {}
    world = int(par.get("dp", 1)) * int(par.get("tp", 1)) * int(par.get("pp", 1))
    device = (spec.get("resources") or {}).get("device", "cpu")
    return world, device


def image_repo_tag(image):
    """'prom/prometheus:v3.5.0' -> ('prom/prometheus', 'v3.5.0'); digest -> tag '@...'."""
    if "@" in image:
        return image.split("@")[0].rsplit(":", 1)[0], "@" + image.split("@")[1]
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, None


def check_image(where, image):
    repo, tag = image_repo_tag(image)
    if not tag:
        return [f"{where}: image {image} has no tag (means latest)"]
    if tag == "latest":
        return [f"{where}: image {image} is not pinned"]
    return []


# ---------------------------------------------------------------------------
# docker-compose.yml

def interpolate(value, problems, where):
    """Compose's ${VAR:-default} / ${VAR-default} / ${VAR} / $$ with no
    variable set: the file must work without an .env."""
    if isinstance(value, dict):
        return {k: interpolate(v, problems, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, problems, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.group(1), m.group(2), m.group(3)
        if op in (":-", "-"):
            return default
        problems.append(f"{where}: ${{{name}}} has no default")
        return ""
    return re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}", sub, value)


def load_compose(path):
    with open(path) as f:
        raw = yaml.safe_load(f)
    # A round trip through JSON unshares what YAML anchors share.
    return json.loads(json.dumps(raw))


def compose_argv(svc):
    """entrypoint + command (the images have no ENTRYPOINT of their own)."""
    parts = [svc.get(k) for k in ("entrypoint", "command")]
    if all(p is None for p in parts):
        return None
    return [a for p in parts if p is not None for a in (p if isinstance(p, list) else shlex.split(p))]


def check_compose(raw, progs, source_dir, compose_path):
    problems = []
    where = os.path.relpath(compose_path, source_dir)
    d = interpolate(raw, problems, where)
    services = d.get("services") or {}
    declared = set((d.get("volumes") or {}).keys())
    used_volumes = set()
    compose_dir = os.path.dirname(compose_path)
    info = {}  # service -> parsed facts

    for name, svc in services.items():
        w = f"{where}: services.{name}"
        image = svc.get("image")
        if not image:
            problems.append(f"{w}: no image")
            continue
        problems += check_image(w, image)
        repo, _ = image_repo_tag(image)
        ours = repo in OUR_IMAGES
        raw_image = raw["services"][name].get("image", "")
        if ours and "SHARDTRAIN_VERSION" not in raw_image:
            problems.append(f"{w}: image {raw_image} is not tagged with ${{SHARDTRAIN_VERSION}}")
        restart = svc.get("restart")
        one_shot = restart == "no"
        if restart not in ("no", "always", "unless-stopped", "on-failure"):
            problems.append(f"{w}: restart policy {restart!r}: set one (\"no\" for one-shot services)")
        if not one_shot and "healthcheck" not in svc:
            problems.append(f"{w}: long-running service without a healthcheck")

        mounts = {}  # target -> source
        for v in svc.get("volumes") or []:
            if isinstance(v, dict):
                source, target = v.get("source", ""), v.get("target", "")
            else:
                parts = v.split(":")
                source, target = (parts[0], parts[1]) if len(parts) > 1 else ("", parts[0])
            mounts[target] = source
            if source.startswith((".", "/")):
                if not os.path.exists(os.path.join(compose_dir, source)):
                    problems.append(f"{w}: bind mount source {source} does not exist")
            elif source:
                used_volumes.add(source)
                if source not in declared:
                    problems.append(f"{w}: volume {source} is not declared under volumes:")

        for dep, cond in (svc.get("depends_on") or {}).items() if isinstance(svc.get("depends_on"), dict) \
                else [(x, {}) for x in svc.get("depends_on") or []]:
            if dep not in services:
                problems.append(f"{w}: depends_on {dep}: no such service")
                continue
            c = (cond or {}).get("condition", "service_started")
            if c == "service_healthy" and "healthcheck" not in services[dep]:
                problems.append(f"{w}: waits for {dep} to be healthy, but it has no healthcheck")
            if c == "service_completed_successfully" and services[dep].get("restart") != "no":
                problems.append(f"{w}: waits for {dep} to complete, but it is not a one-shot service")

        facts = {"ours": ours, "mounts": mounts, "role": None, "values": {}, "svc": svc,
                 "aliases": set(((svc.get("networks") or {}).get("default") or {}).get("aliases") or [])
                 if isinstance(svc.get("networks"), dict) else set()}
        info[name] = facts
        if not ours:
            continue
        argv = compose_argv(svc)
        if argv is None:
            problems.append(f"{w}: no command (the image's default is not a deployment's)")
            continue
        for line in command_lines(argv):
            program, sub, values, positionals, p = progs.parse(line)
            problems += [f"{w}: {x}" for x in p]
            role = {"shardtrain-coordinator": "coordinator", "shardtrain-worker": "worker"}.get(program, "cli")
            facts.update(role=role, values=values, positionals=positionals, sub=sub)

        if facts["role"] in ("coordinator", "worker"):
            metrics = port_of(facts["values"].get("--metrics-listen"))
            if metrics is None:
                problems.append(f"{w}: no --metrics-listen port: nothing for the healthcheck")
            test = " ".join(map(str, (svc.get("healthcheck") or {}).get("test") or []))
            m = re.search(r"https?://(?:127\.0\.0\.1|localhost):(\d+)(/\S*)", test)
            if not m:
                problems.append(f"{w}: healthcheck does not GET http://127.0.0.1:PORT/healthz ({test!r})")
            else:
                if int(m.group(1)) != metrics:
                    problems.append(f"{w}: healthcheck port {m.group(1)} is not --metrics-listen's {metrics}")
                if m.group(2) != "/healthz":
                    problems.append(f"{w}: healthcheck path {m.group(2)} is not /healthz")

    coordinators = {n: f for n, f in info.items() if f["role"] == "coordinator"}
    workers = {n: f for n, f in info.items() if f["role"] == "worker"}
    clis = {n: f for n, f in info.items() if f["role"] == "cli"}
    if len(coordinators) != 1:
        problems.append(f"{where}: expected one coordinator service, found {sorted(coordinators)}")
    if not workers:
        problems.append(f"{where}: no worker service")

    def check_coordinator_address(w, facts):
        addr = facts["values"].get("--coordinator")
        if not addr:
            problems.append(f"{w}: no --coordinator")
            return
        host, _, port = addr.rpartition(":")
        target = coordinators.get(host)
        if target is None:
            problems.append(f"{w}: --coordinator {addr}: {host} is not the coordinator service ({sorted(coordinators)})")
        elif port_of(target["values"].get("--listen")) != int(port):
            problems.append(f"{w}: --coordinator {addr}: the coordinator listens on "
                            f"{target['values'].get('--listen')}")

    for name, f in coordinators.items():
        w = f"{where}: services.{name}"
        state = f["values"].get("--state-dir")
        if state not in f["mounts"] or f["mounts"][state].startswith((".", "/")):
            problems.append(f"{w}: --state-dir {state} is not a named volume's mount point")

    shared = None  # (volume, path) of the workers
    for name, f in sorted(workers.items()):
        w = f"{where}: services.{name}"
        check_coordinator_address(w, f)
        if "--collective-address" not in f["values"]:
            problems.append(f"{w}: no --collective-address (peers would dial 127.0.0.1)")
        wd = f["svc"].get("working_dir")
        if wd not in f["mounts"] or f["mounts"][wd].startswith((".", "/")):
            problems.append(f"{w}: working_dir {wd} is not the shared volume's mount point "
                            f"(a spec's relative data/ and ckpt/ paths must be shared)")
        else:
            mine = (f["mounts"][wd], wd)
            if shared is None:
                shared = mine
            elif mine != shared:
                problems.append(f"{w}: mounts {mine[0]} at {mine[1]}; other workers {shared[0]} at {shared[1]}")
        gpu = "gpu" in (f["svc"].get("profiles") or [])
        device = f["values"].get("--device", "cpu")
        devices = (((f["svc"].get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
        if gpu:
            if not re.fullmatch(r"cuda:\d+", device):
                problems.append(f"{w}: a gpu-profile worker with --device {device}")
            if not devices or not any(x.get("driver") == "nvidia" and "gpu" in (x.get("capabilities") or [])
                                      and (x.get("count") or x.get("device_ids")) for x in devices):
                problems.append(f"{w}: a gpu-profile worker reserves no NVIDIA GPU (deploy.resources.reservations.devices)")
            if image_repo_tag(f["svc"]["image"])[0] != "shardtrain-cuda":
                problems.append(f"{w}: a gpu-profile worker not on the shardtrain-cuda image")
        elif device != "cpu" or devices:
            problems.append(f"{w}: a worker outside the gpu profile with --device {device} or GPU devices")
    if shared:
        for name, f in coordinators.items():
            if shared[0] in f["mounts"].values():
                problems.append(f"{where}: services.{name}: the coordinator mounts the workers' shared "
                                f"volume {shared[0]}; it needs only its state")

    cpu_ranks = sum(int(((f["svc"].get("deploy") or {}).get("replicas")) or 1)
                    for f in workers.values() if "gpu" not in (f["svc"].get("profiles") or []))
    for name, f in clis.items():
        w = f"{where}: services.{name}"
        check_coordinator_address(w, f)
        if f.get("sub") == "submit" and f.get("positionals"):
            spec = f["positionals"][0]
            wd = f["svc"].get("working_dir", "/opt/shardtrain")
            full = os.path.normpath(os.path.join(wd, spec))
            if not full.startswith("/opt/shardtrain/examples/"):
                problems.append(f"{w}: spec {full} is not one of the image's /opt/shardtrain/examples")
            else:
                local = os.path.join(source_dir, "examples", os.path.relpath(full, "/opt/shardtrain/examples"))
                if not os.path.exists(local):
                    problems.append(f"{w}: spec {spec}: no {os.path.relpath(local, source_dir)}")
                else:
                    world, device = spec_world(local)
                    if device == "cpu" and world > cpu_ranks:
                        problems.append(f"{w}: {spec} needs {world} CPU workers; the file runs {cpu_ranks}")

    for v in sorted(declared - used_volumes):
        problems.append(f"{where}: volume {v} is declared but no service mounts it")

    # Prometheus: what it scrapes must be what the programs serve.
    prom = next((s for s in services.values() if image_repo_tag(s.get("image", ""))[0].endswith("prometheus")), None)
    if prom is None:
        problems.append(f"{where}: no Prometheus service")
    else:
        cfg_src = next((s for t, s in ((v.split(":")[1], v.split(":")[0]) for v in prom.get("volumes") or []
                                       if isinstance(v, str) and v.count(":") >= 1)
                        if t == "/etc/prometheus/prometheus.yml"), None)
        if not cfg_src:
            problems.append(f"{where}: prometheus mounts no /etc/prometheus/prometheus.yml")
        elif os.path.exists(os.path.join(compose_dir, cfg_src)):
            with open(os.path.join(compose_dir, cfg_src)) as fh:
                problems += check_prometheus(yaml.safe_load(fh), services, info, coordinators, workers,
                                             os.path.relpath(os.path.join(compose_dir, cfg_src), source_dir))
    grafana = next((s for s in services.values() if image_repo_tag(s.get("image", ""))[0].endswith("grafana")), None)
    if grafana is None:
        problems.append(f"{where}: no Grafana service")
    else:
        problems += check_grafana(grafana, services, compose_dir, source_dir)
    return problems


def check_prometheus(cfg, services, info, coordinators, workers, where):
    problems = []
    scraped = {}  # service name -> port
    for sc in cfg.get("scrape_configs") or []:
        w = f"{where}: {sc.get('job_name')}"
        relabels = sc.get("metric_relabel_configs") or []
        if not any(r.get("source_labels") == ["exported_job"] and r.get("target_label") == "job_id"
                   for r in relabels):
            problems.append(f"{w}: no metric_relabel_configs storing the programs' job label "
                            f"(exported_job) as job_id")
        for st in sc.get("static_configs") or []:
            for t in st.get("targets") or []:
                host, _, port = t.rpartition(":")
                if host not in info:
                    problems.append(f"{w}: target {t}: no service {host}")
                    continue
                scraped[host] = int(port)
        for dns in sc.get("dns_sd_configs") or []:
            for n in dns.get("names") or []:
                hits = [s for s, f in info.items() if s == n or n in f["aliases"]]
                if not hits:
                    problems.append(f"{w}: dns_sd name {n} is no service or alias")
                for s in hits:
                    scraped[s] = int(dns.get("port", 0))
    for s, f in list(coordinators.items()) + list(workers.items()):
        port = port_of(f["values"].get("--metrics-listen"))
        if s not in scraped:
            problems.append(f"{where}: service {s} is not scraped")
        elif scraped[s] != port:
            problems.append(f"{where}: service {s} scraped on port {scraped[s]}, serves metrics on {port}")
    return problems


def exported_metrics(source_dir):
    names = set()
    for path in glob.glob(os.path.join(source_dir, "**", "*.cc"), recursive=True):
        if "/build" in path or "/tests/" in path:
            continue
        with open(path, errors="replace") as f:
            text = f.read()
        for m in re.finditer(r'Add(Counter|Gauge|Histogram)\(\s*"(shardtrain_[a-z0-9_]+)"', text):
            names.add(m.group(2))
            if m.group(1) == "Histogram":
                names.update(m.group(2) + s for s in ("_bucket", "_sum", "_count"))
    return names


def check_grafana(grafana, services, compose_dir, source_dir):
    problems = []
    mounts = {}
    for v in grafana.get("volumes") or []:
        if isinstance(v, str) and ":" in v:
            parts = v.split(":")
            mounts[parts[1]] = parts[0]
    prov = mounts.get("/etc/grafana/provisioning")
    if not prov:
        return ["grafana: /etc/grafana/provisioning is not mounted"]
    prov_dir = os.path.join(compose_dir, prov)
    ds_uids = set()
    for path in glob.glob(os.path.join(prov_dir, "datasources", "*.y*ml")):
        with open(path) as f:
            for ds in (yaml.safe_load(f) or {}).get("datasources") or []:
                ds_uids.add(ds.get("uid"))
                m = re.match(r"https?://([^:/]+):(\d+)", ds.get("url", ""))
                if not m or m.group(1) not in services:
                    problems.append(f"{os.path.relpath(path, source_dir)}: datasource url {ds.get('url')} "
                                    f"names no service")
    exported = exported_metrics(source_dir)
    for path in glob.glob(os.path.join(prov_dir, "dashboards", "*.y*ml")):
        with open(path) as f:
            for p in (yaml.safe_load(f) or {}).get("providers") or []:
                dash_path = (p.get("options") or {}).get("path")
                src = mounts.get(dash_path)
                rel = os.path.relpath(path, source_dir)
                if not src:
                    problems.append(f"{rel}: dashboards path {dash_path} is not a mount of the grafana service")
                    continue
                for dash in glob.glob(os.path.join(compose_dir, src, "*.json")):
                    problems += check_dashboard(dash, ds_uids, exported, source_dir)
    return problems


def check_dashboard(path, ds_uids, exported, source_dir):
    problems = []
    rel = os.path.relpath(path, source_dir)
    with open(path) as f:
        dash = json.load(f)
    for panel in dash.get("panels") or []:
        w = f"{rel}: panel {panel.get('title')!r}"
        ds = panel.get("datasource")
        if not isinstance(ds, dict) or ds.get("uid") not in ds_uids:
            problems.append(f"{w}: datasource {ds} is not the provisioned one ({sorted(ds_uids)})")
        for t in panel.get("targets") or []:
            expr = t.get("expr", "")
            for name in re.findall(r"\b(shardtrain_[a-z0-9_]+)", expr):
                if name not in exported:
                    problems.append(f"{w}: {name} is not a metric the programs export")
            for labels in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) + re.findall(r"\{([^}]*)\}", expr):
                if re.search(r"(^|[,\s])job\s*(,|$|=|!)", labels):
                    problems.append(f"{w}: groups or filters by `job`, Prometheus' scrape job; "
                                    f"a training job is job_id")
    return problems


# ---------------------------------------------------------------------------
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
            if not any(r.get("sourceLabels") == ["exported_job"] and r.get("targetLabel") == "job_id"
                       for r in ep.get("metricRelabelings") or []):
                problems.append(f"{w}: no metricRelabelings storing exported_job as job_id")
        for s in chosen:
            covered = [p for p in pods if matches(s["spec"].get("selector"), p["labels"])]
            if not covered:
                problems.append(f"{w}: Service/{s['metadata']['name']} selects no pods")
    return problems


# ---------------------------------------------------------------------------
# Dockerfile

def check_dockerfile(text, dockerignore, where):
    problems = []
    lines = re.sub(r"\\\n", " ", text).splitlines()
    instr = [(l.split(None, 1)[0].upper(), l.split(None, 1)[1] if len(l.split(None, 1)) > 1 else "")
             for l in (x.strip() for x in lines) if l and not l.startswith("#")]
    args = {}
    stages, current = {}, None
    for op, rest in instr:
        if op == "ARG" and current is None:
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip().strip('"')
        if op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            base = re.sub(r"\$\{(\w+)\}", lambda mm: args.get(mm.group(1), ""), m.group(1))
            base = re.sub(r"\$\{(\w+)\}", lambda mm: args.get(mm.group(1), ""), base)
            current = m.group(2) or f"stage{len(stages)}"
            stages[current] = {"base": base, "ops": []}
            if base not in stages:
                problems += check_image(f"{where}: FROM {m.group(1)}", base)
        elif current:
            stages[current]["ops"].append((op, rest))
    for name, st in stages.items():
        for op, rest in st["ops"]:
            m = re.search(r"--from=(\S+)", rest)
            if op == "COPY" and m and m.group(1) not in stages:
                problems.append(f"{where}: stage {name}: COPY --from={m.group(1)}: no such stage")
            if op == "RUN" and re.search(r"scripts/setup(?!\s+--only)", rest):
                problems.append(f"{where}: stage {name}: runs scripts/setup without --only "
                                f"(PyTorch, GoogleTest and Prometheus are not build dependencies)")
            if op == "RUN" and "cmake -S" in rest:
                if "-DBUILD_TESTING=OFF" not in rest:
                    problems.append(f"{where}: stage {name}: configures without -DBUILD_TESTING=OFF")
                if "--target shardtrain shardtrain-coordinator shardtrain-worker" not in rest:
                    problems.append(f"{where}: stage {name}: builds more than the three programs")
                if "-DSHARDTRAIN_MARCH=" not in rest:
                    problems.append(f"{where}: stage {name}: no -DSHARDTRAIN_MARCH (native code "
                                    f"would be the build machine's)")
    for final in ("cpu", "cuda"):
        st = stages.get(final)
        if not st:
            problems.append(f"{where}: no `{final}` target")
            continue
        ops = st["ops"]
        users = [r for o, r in ops if o == "USER"]
        if not users or users[-1].split(":")[0] in ("0", "root"):
            problems.append(f"{where}: target {final} does not end as a non-root USER")
        elif users[-1].split(":")[0] != str(IMAGE_UID):
            problems.append(f"{where}: target {final} runs as {users[-1]}, the manifests as {IMAGE_UID}")
        if not any(o == "LABEL" and "org.opencontainers.image.version" in r for o, r in ops):
            problems.append(f"{where}: target {final} has no OCI labels")
        chain = ops + (stages.get(st["base"]) or {}).get("ops", [])
        body = "\n".join(r for _, r in chain)
        for path in ("/srv/shardtrain", "/var/lib/shardtrain", "/opt/shardtrain/examples",
                     "/src/data/fortunes.txt", "/src/data/fortunes-val.txt", "/opt/shardtrain/data/"):
            if path not in body:
                problems.append(f"{where}: target {final} does not create {path}, which the deployments use")
        if f"{IMAGE_UID}:{IMAGE_UID} /var/lib/shardtrain /srv/shardtrain" not in body and \
                "chown" not in body:
            problems.append(f"{where}: target {final} does not give {IMAGE_UID} its directories")
    for pattern in ("build*/", "data/", ".git", "ckpt/"):
        if pattern not in dockerignore.split():
            problems.append(f".dockerignore: no {pattern}")
    return problems


# ---------------------------------------------------------------------------

def run_all(compose_raw, k8s_objs, dockerfile, dockerignore, progs, a):
    compose_path = os.path.join(a.source_dir, "deploy", "docker-compose.yml")
    return (check_compose(compose_raw, progs, a.source_dir, compose_path)
            + check_k8s(k8s_objs, progs, a.source_dir)
            + check_dockerfile(dockerfile, dockerignore, "deploy/Dockerfile"))


def self_test(compose_raw, k8s_objs, dockerfile, dockerignore, progs, a):
    failures = []
    if run_all(compose_raw, k8s_objs, dockerfile, dockerignore, progs, a):
        return ["self-test: the files are not clean to begin with"]

    def expect(what, needle, compose=None, k8s=None, docker=None):
        got = run_all(compose if compose is not None else compose_raw, k8s if k8s is not None else k8s_objs,
                      docker if docker is not None else dockerfile, dockerignore, progs, a)
        if not any(needle in g for g in got):
            failures.append(f"self-test: {what} was not reported (wanted {needle!r}, got {got or 'nothing'})")

    def c():
        return copy.deepcopy(compose_raw)

    def k():
        return copy.deepcopy(k8s_objs)

    def k8s_container(objs, kind, name):
        o = next(o for _, o in objs if o["kind"] == kind and o["metadata"]["name"] == name)
        return o, o["spec"]["template"]["spec"]["containers"][0]

    d = c(); d["services"]["worker"]["command"][2] = d["services"]["worker"]["command"][2].replace(
        "--metrics-listen", "--metric-listen")
    expect("a misspelt worker flag in compose", "unknown flag --metric-listen", compose=d)
    d = c(); d["services"]["coordinator"]["healthcheck"]["test"][-1] = "http://127.0.0.1:9091/healthz"
    expect("a healthcheck on the wrong port", "healthcheck port 9091 is not --metrics-listen's 9090", compose=d)
    d = c(); d["services"]["worker"]["volumes"] = ["shard:/srv/shardtrain"]
    expect("an undeclared volume", "volume shard is not declared", compose=d)
    d = c(); d["services"]["coordinator"]["volumes"].append("shared:/srv/shardtrain")
    expect("a coordinator on the shared volume", "the coordinator mounts the workers' shared", compose=d)
    d = c(); d["services"]["submit"]["command"][4] = "coordinator:7071"
    expect("a submit to the wrong port", "the coordinator listens on", compose=d)
    d = c(); del d["services"]["worker-gpu-0"]["deploy"]
    expect("a GPU worker without a GPU", "reserves no NVIDIA GPU", compose=d)
    d = c(); d["services"]["grafana"]["image"] = "grafana/grafana:latest"
    expect("an unpinned image", "is not pinned", compose=d)
    d = c(); d["services"]["worker"]["deploy"]["replicas"] = 2
    expect("too few workers for the example", "needs 4 CPU workers", compose=d)
    d = c(); d["services"]["worker"]["command"][2] = d["services"]["worker"]["command"][2].replace(
        "--threads ${SHARDTRAIN_WORKER_THREADS:-1}", "--threads 0")
    expect("a value out of range", "--threads 0 outside [1, 1024]", compose=d)
    d = c(); d["services"]["prometheus"]["volumes"][0] = "./prometheus.yaml:/etc/prometheus/prometheus.yml:ro"
    expect("a missing bind mount source", "bind mount source ./prometheus.yaml does not exist", compose=d)

    o = k(); _, ct = k8s_container(o, "StatefulSet", "shardtrain-worker")
    ct["readinessProbe"]["httpGet"]["port"] = "metric"
    expect("a probe on an undeclared port name", "readinessProbe port metric is no containerPort", k8s=o)
    o = k(); _, ct = k8s_container(o, "StatefulSet", "shardtrain-worker")
    ct["command"][ct["command"].index("--collective-address")] = "--colective-address"
    expect("a misspelt worker flag in k8s", "unknown flag --colective-address", k8s=o)
    o = k(); _, ct = k8s_container(o, "StatefulSet", "shardtrain-worker")
    ct["command"][-1] = "$(POD_IPP)"
    expect("an unresolved $(VAR)", "$(POD_IPP) is not an env var", k8s=o)
    o = k(); sts, _ = k8s_container(o, "StatefulSet", "shardtrain-worker")
    sts["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = "shardtrain-data"
    expect("an unknown claim", "no PersistentVolumeClaim shardtrain-data", k8s=o)
    o = k(); _, ct = k8s_container(o, "StatefulSet", "shardtrain-worker")
    del ct["resources"]
    expect("a container without resources", "no resources.requests.cpu", k8s=o)
    o = k(); _, ct = k8s_container(o, "StatefulSet", "shardtrain-coordinator")
    ct["imagePullPolicy"] = "Always"
    expect("pull policy Always", "imagePullPolicy Always", k8s=o)
    o = k(); _, ct = k8s_container(o, "StatefulSet", "shardtrain-worker-gpu")
    ct["workingDir"] = "/opt/shardtrain"
    expect("a worker working outside the shared volume", "workingDir /opt/shardtrain is not the mount point", k8s=o)
    o = k(); _, ct = k8s_container(o, "StatefulSet", "shardtrain-worker-gpu")
    del ct["resources"]["limits"]["nvidia.com/gpu"]
    expect("a GPU worker without a GPU limit", "without a nvidia.com/gpu limit", k8s=o)
    o = k(); svc = next(o for _, o in o if o["kind"] == "Service" and o["metadata"]["name"] == "shardtrain-coordinator")
    svc["spec"]["ports"][0]["targetPort"] = "rpc"
    expect("a Service port that leads nowhere", "targets rpc", k8s=o)
    o = k(); _, ct = k8s_container(o, "Job", "shardtrain-submit-example")
    ct["command"][2] = "examples/fortunes-dp.yaml"
    expect("a missing example spec", "is not one of examples/", k8s=o)

    expect("scripts/setup run whole", "runs scripts/setup without --only",
           docker=dockerfile.replace("scripts/setup --only build", "scripts/setup"))
    expect("tests built in the image", "without -DBUILD_TESTING=OFF",
           docker=dockerfile.replace("-DBUILD_TESTING=OFF", ""))
    expect("an image running as root", "does not end as a non-root USER",
           docker=dockerfile.replace("USER 10001:10001", "USER root"))
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    src = a.source_dir
    progs = Programs(a.bin_dir)
    compose_raw = load_compose(os.path.join(src, "deploy", "docker-compose.yml"))
    k8s_objs = load_k8s(sorted(glob.glob(os.path.join(src, "deploy", "k8s", "*.yaml"))))
    with open(os.path.join(src, "deploy", "Dockerfile")) as f:
        dockerfile = f.read()
    ignore_path = os.path.join(src, ".dockerignore")
    dockerignore = open(ignore_path).read() if os.path.exists(ignore_path) else ""
    problems = run_all(compose_raw, k8s_objs, dockerfile, dockerignore, progs, a)
    if a.self_test:
        problems += self_test(compose_raw, k8s_objs, dockerfile, dockerignore, progs, a)
    for p in problems:
        print(p)
    if problems:
        print(f"check_references: {len(problems)} problem(s)")
        return 1
    n_k8s = len(k8s_objs)
    print(f"check_references: docker-compose.yml ({len(compose_raw['services'])} services), "
          f"{n_k8s} Kubernetes objects, the Dockerfile{', the self-test' if a.self_test else ''}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
