"""docker-compose.yml, prometheus.yml and the Grafana provisioning and
dashboard, checked against the programs and each other (check_references.py)."""
import glob
import json
import os
import re
import shlex

import yaml

from refs_common import (OUR_IMAGES, check_image, command_lines, etcd_flags, image_repo_tag, port_of,
                         spec_world)


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


def merge_compose(base, override):
    """`docker compose -f base -f override`, for what the override files
    here use: mappings merge key by key, anything else (command,
    healthcheck.test, ports of a new service) is replaced. deploy_compose runs
    compose's own merge (`docker-compose config`) on the same files."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge_compose(base[k], v) if k in base else v
        return out
    return override


def check_etcd_members(services, info, where):
    """The etcd services: each names itself in one --initial-cluster that
    lists exactly them at their peer URLs, advertises its own client URL and
    keeps its data on a named volume."""
    problems, members = [], {}
    for name, f in info.items():
        if not image_repo_tag(f["svc"].get("image", ""))[0].endswith("/etcd"):
            continue
        w = f"{where}: services.{name}"
        flags = etcd_flags(compose_argv(f["svc"]) or [])
        members[name] = flags
        if flags.get("--name") != name:
            problems.append(f"{w}: etcd --name {flags.get('--name')} is not the service's name")
        if flags.get("--advertise-client-urls") != f"http://{name}:2379":
            problems.append(f"{w}: --advertise-client-urls {flags.get('--advertise-client-urls')} "
                            f"is not http://{name}:2379")
        data = flags.get("--data-dir")
        if data not in f["mounts"] or f["mounts"][data].startswith((".", "/")):
            problems.append(f"{w}: --data-dir {data} is not a named volume's mount point")
    for name, flags in members.items():
        cluster = dict(m.split("=", 1) for m in (flags.get("--initial-cluster") or "").split(",") if "=" in m)
        want = {n: f"http://{n}:2380" for n in members}
        if cluster != want:
            problems.append(f"{where}: services.{name}: --initial-cluster {flags.get('--initial-cluster')} "
                            f"does not list exactly the etcd services {sorted(members)} at their peer URLs")
        if flags.get("--initial-advertise-peer-urls") != want[name]:
            problems.append(f"{where}: services.{name}: --initial-advertise-peer-urls is not {want[name]}")
    if members and len(members) % 2 == 0:
        problems.append(f"{where}: {len(members)} etcd members: an even count tolerates no more "
                        f"failures than one fewer")
    return problems, members


def compose_argv(svc):
    """entrypoint + command (the images have no ENTRYPOINT of their own)."""
    parts = [svc.get(k) for k in ("entrypoint", "command")]
    if all(p is None for p in parts):
        return None
    return [a for p in parts if p is not None for a in (p if isinstance(p, list) else shlex.split(p))]


def check_compose(raw, progs, source_dir, compose_path, where=None):
    """`where` names the file(s) in problems (default: compose_path)."""
    problems = []
    where = where or os.path.relpath(compose_path, source_dir)
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
            # A coordinator on etcd may stand by: alive (/livez) but not
            # ready (/healthz is the leader's alone).
            on_etcd = str(facts["values"].get("--state", "")).startswith("etcd://")
            path = "/livez" if on_etcd else "/healthz"
            if not m:
                problems.append(f"{w}: healthcheck does not GET http://127.0.0.1:PORT{path} ({test!r})")
            else:
                if int(m.group(1)) != metrics:
                    problems.append(f"{w}: healthcheck port {m.group(1)} is not --metrics-listen's {metrics}")
                if m.group(2) != path:
                    problems.append(f"{w}: healthcheck path {m.group(2)} is not {path}"
                                    + (" (a standby is alive but not ready)" if on_etcd else ""))

    coordinators = {n: f for n, f in info.items() if f["role"] == "coordinator"}
    workers = {n: f for n, f in info.items() if f["role"] == "worker"}
    clis = {n: f for n, f in info.items() if f["role"] == "cli"}
    etcd_problems, etcd_members = check_etcd_members(services, info, where)
    problems += etcd_problems
    states = {f["values"].get("--state", "sqlite") for f in coordinators.values()}
    if not coordinators:
        problems.append(f"{where}: no coordinator service")
    elif len(coordinators) > 1 and (len(states) != 1 or not next(iter(states)).startswith("etcd://")):
        problems.append(f"{where}: coordinators {sorted(coordinators)} do not share one etcd --state "
                        f"({sorted(states)}): several states would mean several leaders")
    if not workers:
        problems.append(f"{where}: no worker service")

    def check_coordinator_address(w, facts):
        addrs = facts["values"].get("--coordinator")
        if not addrs:
            problems.append(f"{w}: no --coordinator")
            return
        named = set()
        for addr in addrs.split(","):
            host, _, port = addr.rpartition(":")
            target = coordinators.get(host)
            named.add(host)
            if target is None:
                problems.append(f"{w}: --coordinator {addr}: {host} is not a coordinator service "
                                f"({sorted(coordinators)})")
            elif port_of(target["values"].get("--listen")) != int(port):
                problems.append(f"{w}: --coordinator {addr}: the coordinator listens on "
                                f"{target['values'].get('--listen')}")
        if set(coordinators) - named:
            problems.append(f"{w}: --coordinator {addrs} leaves out {sorted(set(coordinators) - named)}, "
                            f"which may be the leader")

    for name, f in coordinators.items():
        w = f"{where}: services.{name}"
        state = f["values"].get("--state", "sqlite")
        if state.startswith("etcd://"):
            for member in state[len("etcd://"):].split("/")[0].split(","):
                host, _, port = member.rpartition(":")
                if host not in etcd_members or port != "2379":
                    problems.append(f"{w}: --state names {member}, not an etcd service's client URL "
                                    f"({sorted(etcd_members)}, port 2379)")
            listen = port_of(f["values"].get("--listen"))
            if f["values"].get("--advertise") != f"{name}:{listen}":
                problems.append(f"{w}: --advertise {f['values'].get('--advertise')} is not {name}:{listen}, "
                                f"the address standbys name and workers follow")
            continue
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
    problems += job_label_uses(source_dir)
    return problems


def check_prometheus(cfg, services, info, coordinators, workers, where):
    problems = []
    scraped = {}  # service name -> port
    for sc in cfg.get("scrape_configs") or []:
        w = f"{where}: {sc.get('job_name')}"
        # The programs export `job_id` themselves: a rule about `exported_job`
        # is stale (it matches nothing, or hides a program exporting `job`).
        for r in sc.get("metric_relabel_configs") or []:
            if "exported_job" in json.dumps(r):
                problems.append(f"{w}: metric_relabel_configs rule {r} names exported_job; "
                                f"the programs label a training job job_id")
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


def job_label_uses(source_dir):
    """Metric registrations in the programs' sources that use the label `job`
    (Prometheus keeps it for the scrape target and renames theirs)."""
    problems = []
    sources = [path for ext in ("*.cc", "*.h")  # a series may be registered in a header
               for path in glob.glob(os.path.join(source_dir, "**", ext), recursive=True)]
    for path in sources:
        if "/build" in path or "/tests/" in path:
            continue
        with open(path, errors="replace") as f:
            text = f.read()
        # Up to the first ')': the label list comes before any bucket arguments.
        for m in re.finditer(r'Add(?:Counter|Gauge|Histogram)\(\s*"(shardtrain_[a-z0-9_]+)"([^)]*)\)', text):
            if re.search(r'"job"', m.group(2)):
                problems.append(f"{os.path.relpath(path, source_dir)}: {m.group(1)} has the label `job`; "
                                f"use job_id")
    return problems


def exported_metrics(source_dir):
    names = set()
    sources = [path for ext in ("*.cc", "*.h")  # a series may be registered in a header
               for path in glob.glob(os.path.join(source_dir, "**", ext), recursive=True)]
    for path in sources:
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
