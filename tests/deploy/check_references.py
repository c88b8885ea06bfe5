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
the paths they mount. deploy/k8s/shardtrain.yaml and shardtrain-ha.yaml are
alternatives (one is applied): the Kubernetes checks run once with each and
the other files; with the HA one, etcd's StatefulSet, the coordinators' etcd
URL, --advertise, probes and update strategy are checked too.

  check_references.py --source-dir DIR --bin-dir DIR [--self-test]

--self-test breaks the files in memory in known ways and requires each break
to be reported. Prints one line per problem; exits 1 if there are any.
Needs PyYAML (Debian's python3-yaml). The compose, Prometheus and Grafana checks
are in refs_compose.py, the Kubernetes ones in refs_k8s.py, the programs' flags
in refs_common.py; the Dockerfile's and the self-test are here.
"""
import argparse
import copy
import glob
import os
import re
import sys

from refs_common import IMAGE_UID, Programs, check_image
from refs_compose import check_compose, load_compose, merge_compose
from refs_k8s import HA_SET, SINGLE_SET, alternative_sets, check_k8s_sets, load_k8s


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

# deploy/docker-compose.ha.yml, read by main(): checked layered over the base
# file, as compose runs it.
HA_OVERRIDE = {}


def run_all(compose_raw, k8s_sets, dockerfile, dockerignore, progs, a, ha=None):
    compose_path = os.path.join(a.source_dir, "deploy", "docker-compose.yml")
    ha_merged = merge_compose(compose_raw, HA_OVERRIDE if ha is None else ha)
    return (check_compose(compose_raw, progs, a.source_dir, compose_path)
            + check_compose(ha_merged, progs, a.source_dir, compose_path,
                            where="deploy/docker-compose.yml + docker-compose.ha.yml")
            + check_k8s_sets(k8s_sets, progs, a.source_dir)
            + check_dockerfile(dockerfile, dockerignore, "deploy/Dockerfile"))


def self_test(compose_raw, k8s_sets, dockerfile, dockerignore, progs, a):
    failures = []
    if run_all(compose_raw, k8s_sets, dockerfile, dockerignore, progs, a):
        return ["self-test: the files are not clean to begin with"]

    # k8s: the objects of set k8s_set, broken; the other sets as they are. A
    # break of k8s alone runs the k8s checks alone (the rest is clean, above).
    def expect(what, needle, compose=None, k8s=None, docker=None, ha=None, k8s_set=SINGLE_SET):
        sets = k8s_sets if k8s is None else {**k8s_sets, k8s_set: k8s}
        if k8s is not None and compose is None and docker is None and ha is None:
            got = check_k8s_sets(sets, progs, a.source_dir)
        else:
            got = run_all(compose if compose is not None else compose_raw, sets,
                          docker if docker is not None else dockerfile, dockerignore, progs, a, ha=ha)
        if not any(needle in g for g in got):
            failures.append(f"self-test: {what} was not reported (wanted {needle!r}, got {got or 'nothing'})")

    def c():
        return copy.deepcopy(compose_raw)

    def h():
        return copy.deepcopy(HA_OVERRIDE)

    def k(k8s_set=SINGLE_SET):
        return copy.deepcopy(k8s_sets[k8s_set])

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
    d = h(); d["services"]["coordinator-2"]["command"][4:6] = ["--state-dir", "/var/lib/shardtrain"]
    expect("a standby on SQLite beside an etcd leader", "do not share one etcd --state", ha=d)
    d = h(); d["services"]["submit"]["command"][4] = "coordinator:7070"
    expect("a client that cannot follow the leader", "leaves out ['coordinator-2']", ha=d)
    d = h(); d["services"]["coordinator-2"]["command"][7] = "coordinator:7070"
    expect("a coordinator advertising another's address", "--advertise coordinator:7070 is not coordinator-2:7070", ha=d)
    d = h(); d["services"]["coordinator-2"]["command"][5] = "etcd://etcd-1:2379,etcd-4:2379"
    expect("an etcd URL naming no member", "--state names etcd-4:2379", ha=d)
    d = h(); d["services"]["etcd-3"]["command"][14] = "etcd-1=http://etcd-1:2380,etcd-2=http://etcd-2:2380"
    expect("an initial cluster without a member", "does not list exactly the etcd services", ha=d)
    d = h(); d["services"]["coordinator-2"]["healthcheck"]["test"][-1] = "http://127.0.0.1:9090/healthz"
    expect("a standby's healthcheck on /healthz", "healthcheck path /healthz is not /livez", ha=d)

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
    o = k(); sts, _ = k8s_container(o, "StatefulSet", "shardtrain-coordinator")
    sts["spec"]["replicas"] = 2
    expect("two coordinators on one SQLite state", "2 replicas on SQLite", k8s=o)

    # The HA set: etcd, and coordinators that elect a leader on it.
    def ha(kind, name):
        o = k(HA_SET)
        return (o,) + k8s_container(o, kind, name)

    def ha_coordinator():
        return ha("Deployment", "shardtrain-coordinator")

    def ha_etcd():
        return ha("StatefulSet", "shardtrain-etcd")

    def ha_object(o, kind, name):
        return next(x for _, x in o if x["kind"] == kind and x["metadata"]["name"] == name)

    def etcd_flag(ct, flag, value):  # etcd's --flag=value
        i = next(i for i, x in enumerate(ct["command"]) if x.startswith(flag + "="))
        ct["command"][i] = f"{flag}={value}"

    o, _, ct = ha_coordinator(); i = ct["command"].index("--state")
    ct["command"][i:i + 2] = ["--state-dir", "/tmp"]
    expect("two coordinators on SQLite", "2 replicas on SQLite", k8s=o, k8s_set=HA_SET)
    o, _, ct = ha_coordinator(); i = ct["command"].index("--state") + 1
    ct["command"][i] = ct["command"][i].replace("etcd-2.shardtrain-etcd", "etcd-3.shardtrain-etcd")
    expect("an etcd URL naming no member", "StatefulSet/shardtrain-etcd has no pod shardtrain-etcd-3",
           k8s=o, k8s_set=HA_SET)
    o, _, ct = ha_coordinator(); ct["command"][ct["command"].index("--state") + 1] = "etcd://etcd-0:2379"
    expect("an etcd URL naming no Service", "which is no <pod>.<service>:PORT", k8s=o, k8s_set=HA_SET)
    o, _, ct = ha_coordinator(); i = ct["command"].index("--state") + 1
    ct["command"][i] = ct["command"][i].replace(":2379", ":2380")
    expect("an etcd URL on the peer port", "has no port 2380 leading to the members' client port 2379",
           k8s=o, k8s_set=HA_SET)
    o, _, ct = ha_coordinator(); i = ct["command"].index("--state") + 1
    ct["command"][i] = ct["command"][i].split(",")[0]
    expect("an etcd URL naming one member of 3", "--state leaves out", k8s=o, k8s_set=HA_SET)
    o, _, ct = ha_coordinator(); ct["livenessProbe"]["httpGet"]["path"] = "/healthz"
    expect("a standby's liveness on /healthz", "livenessProbe path /healthz is not /livez", k8s=o, k8s_set=HA_SET)
    o, dep, _ = ha_coordinator(); dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] = 1
    expect("a rolling update that stalls", "maxUnavailable 1 of 2 replicas", k8s=o, k8s_set=HA_SET)
    o, dep, _ = ha_coordinator(); del dep["spec"]["strategy"]
    expect("the default rolling update", "maxUnavailable 25% of 2 replicas", k8s=o, k8s_set=HA_SET)
    o, _, ct = ha_coordinator(); i = ct["command"].index("--advertise")
    del ct["command"][i:i + 2]
    expect("a coordinator on etcd without --advertise", "on etcd without --advertise", k8s=o, k8s_set=HA_SET)
    o, _, ct = ha_coordinator(); ct["command"][ct["command"].index("--advertise") + 1] = "shardtrain-coordinator:7070"
    expect("coordinators advertising one address", "is not the pod's own address", k8s=o, k8s_set=HA_SET)
    o, _, ct = ha_coordinator(); ct["readinessProbe"].update(periodSeconds=10, failureThreshold=3)
    expect("a slow readiness probe", "would follow a change of leader up to 30 s late", k8s=o, k8s_set=HA_SET)
    o, dep, _ = ha_coordinator(); del dep["spec"]["template"]["spec"]["affinity"]
    expect("coordinators free to share a node", "no podAntiAffinity on kubernetes.io/hostname", k8s=o, k8s_set=HA_SET)
    o, _, _ = ha_coordinator()
    ha_object(o, "Service", "shardtrain-coordinator")["spec"]["publishNotReadyAddresses"] = True
    expect("a Service leading to standbys", "publishNotReadyAddresses: it would lead to standby", k8s=o,
           k8s_set=HA_SET)
    o, _, et = ha_etcd()
    etcd_flag(et, "--initial-cluster", ",".join(f"shardtrain-etcd-{i}=http://shardtrain-etcd-{i}.shardtrain-etcd:2380"
                                                for i in range(2)))
    expect("an initial cluster without a member", "--initial-cluster does not name exactly its 3 replicas",
           k8s=o, k8s_set=HA_SET)
    o, sts, _ = ha_etcd(); sts["spec"]["replicas"] = 5
    expect("more members than the initial cluster", "--initial-cluster does not name exactly its 5", k8s=o,
           k8s_set=HA_SET)
    o, sts, _ = ha_etcd(); del sts["spec"]["podManagementPolicy"]
    expect("members started one by one", "podManagementPolicy OrderedReady", k8s=o, k8s_set=HA_SET)
    o, _, _ = ha_etcd(); del ha_object(o, "Service", "shardtrain-etcd")["spec"]["publishNotReadyAddresses"]
    expect("member names that do not resolve before Ready", "lacks publishNotReadyAddresses", k8s=o,
           k8s_set=HA_SET)
    o, _, et = ha_etcd(); etcd_flag(et, "--advertise-client-urls", "http://shardtrain-etcd:2379")
    expect("a member advertising another name", "is not one URL of the member's own name", k8s=o, k8s_set=HA_SET)
    o, _, et = ha_etcd(); etcd_flag(et, "--data-dir", "/var/lib/etcd/data")
    expect("a member's data off its claim", "--data-dir /var/lib/etcd/data is not the mount point", k8s=o,
           k8s_set=HA_SET)
    o, _, et = ha_etcd(); etcd_flag(et, "--name", "$(POD_NAMES)")
    expect("an etcd $(VAR) that is no env var", "$(POD_NAMES) is not an env var", k8s=o, k8s_set=HA_SET)
    o, _, _ = ha_etcd(); del ha_object(o, "NetworkPolicy", "shardtrain-etcd")["spec"]["ingress"][0]["from"][0]
    expect("a NetworkPolicy that shuts the coordinators out", "a NetworkPolicy keeps the coordinator from",
           k8s=o, k8s_set=HA_SET)
    expect("both alternatives applied together", "is also defined in",
           k8s=k(HA_SET) + [x for x in k() if x[0] == SINGLE_SET], k8s_set=HA_SET)

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
    HA_OVERRIDE.update(load_compose(os.path.join(src, "deploy", "docker-compose.ha.yml")))
    k8s_sets = alternative_sets(load_k8s(sorted(glob.glob(os.path.join(src, "deploy", "k8s", "*.yaml")))))
    with open(os.path.join(src, "deploy", "Dockerfile")) as f:
        dockerfile = f.read()
    ignore_path = os.path.join(src, ".dockerignore")
    dockerignore = open(ignore_path).read() if os.path.exists(ignore_path) else ""
    problems = run_all(compose_raw, k8s_sets, dockerfile, dockerignore, progs, a)
    if a.self_test:
        problems += self_test(compose_raw, k8s_sets, dockerfile, dockerignore, progs, a)
    for p in problems:
        print(p)
    if problems:
        print(f"check_references: {len(problems)} problem(s)")
        return 1
    n_k8s = ", ".join(f"{len(objs)} with {name}" for name, objs in k8s_sets.items())
    print(f"check_references: docker-compose.yml ({len(compose_raw['services'])} services), "
          f"with docker-compose.ha.yml ({len(HA_OVERRIDE['services'])} services layered), "
          f"Kubernetes objects ({n_k8s}), the Dockerfile{', the self-test' if a.self_test else ''}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
