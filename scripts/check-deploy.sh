#!/usr/bin/env bash
# Check the deployment files statically (no Docker engine, registry or Kubernetes cluster needed):
# - every YAML file under deploy/ parses (PyYAML);
# - Dockerfile: multi-stage, `cargo build --release --locked`, a non-root USER, a VOLUME for the
#   data directory, a HEALTHCHECK through `meshwire status`; .dockerignore keeps what the build
#   needs;
# - deploy/compose.yaml: 5 node services, every file it mounts or builds from exists, ports are
#   published on 127.0.0.1 only, each node's fixed address and identity are in the shared config;
# - every node config passes `meshwire node --check-config` with its own identity: the compose
#   cluster's, and the Kubernetes ConfigMap and identities deploy/k8s/generate.sh makes;
# - deploy/k8s: a headless Service, a StatefulSet naming it, with a ConfigMap, the identities
#   Secret, PVC templates, readiness and liveness probes and the prometheus.io annotations;
# - deploy/grafana/meshwire.json parses and every metric it queries is registered in the code.
# Exit status 0 when all pass, 1 with the failures listed otherwise.
#
# Environment: MESHWIRE=path to a meshwire binary (default: build target/debug/meshwire).
set -euo pipefail
cd "$(dirname "$0")/.."
# A refused config is reported by its message, not a backtrace.
export RUST_LIB_BACKTRACE=0

if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "check-deploy needs python3 with PyYAML (apt-get install python3-yaml, or pip install pyyaml)" >&2
  exit 1
fi
if [ -n "${MESHWIRE:-}" ]; then
  bin=$MESHWIRE
else
  cargo build --locked --quiet --bin meshwire
  bin="${CARGO_TARGET_DIR:-target}/debug/meshwire"
fi
work=$(mktemp -d /tmp/mwdeploy.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0

echo "== node configs pass meshwire node --check-config"
check_config() { # label config data_dir
  local out
  if out=$(RUST_LOG=error "$bin" node --config "$2" --data-dir "$3" --check-config 2>&1); then
    echo "$1: $out"
  else
    echo "FAILED: $1: $out"
    failures=$((failures + 1))
  fi
}
for dir in deploy/config/node*/; do
  node=$(basename "$dir")
  # A copy, so the check reads the committed key without tripping on its file mode.
  mkdir -p "$work/compose/$node"
  install -m 0600 "$dir/identity.pem" "$work/compose/$node/identity.pem"
  check_config "compose $node" deploy/config/meshwire.toml "$work/compose/$node"
done
NAMESPACE=meshwire MESHWIRE=$bin bash deploy/k8s/generate.sh "$work/k8s" 5 >/dev/null
python3 - "$work/k8s" <<'PY'
import os, sys, yaml
out = sys.argv[1]
config = yaml.safe_load(open(os.path.join(out, "configmap.yaml")))
open(os.path.join(out, "meshwire.toml"), "w").write(config["data"]["meshwire.toml"])
secret = yaml.safe_load(open(os.path.join(out, "secret.yaml")))
for name, pem in secret["stringData"].items():
    pod = name.removesuffix(".pem")
    os.makedirs(os.path.join(out, pod), mode=0o700)
    fd = os.open(os.path.join(out, pod, "identity.pem"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, pem.encode())
    os.close(fd)
PY
for dir in "$work"/k8s/meshwire-*/; do
  check_config "k8s $(basename "$dir")" "$work/k8s/meshwire.toml" "$dir"
done
# Each node's PeerId, for the structural checks below.
for dir in "$work"/compose/node* "$work"/k8s/meshwire-*/; do
  printf '%s\t%s\n' "$(basename "$dir")" "$("$bin" id --data-dir "$dir")"
done >"$work/ids.tsv"

echo "== structure of Dockerfile, compose, k8s and Grafana files"
python3 - "$work" <<'PY' || failures=$((failures + 1))
import glob, json, os, re, sys, tomllib, yaml

work = sys.argv[1]
problems = []
def check(condition, message):
    if not condition:
        problems.append(message)
    return condition

ids = dict(line.rstrip("\n").split("\t") for line in open(os.path.join(work, "ids.tsv")))

# Every YAML file parses.
documents = {}
for path in sorted(glob.glob("deploy/**/*.yaml", recursive=True) + glob.glob("deploy/**/*.yml", recursive=True)):
    try:
        documents[path] = list(yaml.safe_load_all(open(path)))
    except yaml.YAMLError as error:
        problems.append(f"{path} does not parse: {error}")
print(f"{len(documents)} YAML files parse: {', '.join(documents)}")

# Dockerfile and .dockerignore.
dockerfile = open("Dockerfile").read()
instructions = [line.split(None, 1) for line in re.sub(r"\\\n", " ", dockerfile).splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
froms = [rest for word, *rest in instructions if word == "FROM"]
check(len(froms) >= 2, "Dockerfile is not multi-stage")
check(re.search(r"cargo build --release --locked --bin meshwire", dockerfile), "Dockerfile does not build with --release --locked")
users = [rest[0].split(":")[0] for word, *rest in instructions if word == "USER"]
check(users and users[-1] not in ("0", "root"), "Dockerfile's runtime user is root")
check(any(word == "VOLUME" and "/data" in rest[0] for word, *rest in instructions), "Dockerfile has no VOLUME /data")
check(any(word == "HEALTHCHECK" and "meshwire" in rest[0] and "status" in rest[0] for word, *rest in instructions),
      "Dockerfile's HEALTHCHECK does not run meshwire status")
ignore = [l.strip() for l in open(".dockerignore") if l.strip() and not l.startswith("#")]
for needed in ["Cargo.toml", "Cargo.lock", "README.md", "crates/", ".cargo/config.toml"]:
    check(f"!{needed}" in ignore, f".dockerignore leaves out {needed}, which the build needs")
for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.M):
    for source in copied.split():
        check(os.path.exists(source), f"Dockerfile copies {source}, which does not exist")

# Compose.
compose = documents["deploy/compose.yaml"][0]
config = tomllib.load(open("deploy/config/meshwire.toml", "rb"))
peer_addresses = {entry.split("@")[1].split(":")[0]: entry.split("@")[0] for entry in config["peers"]}
services = compose["services"]
check(len(services) == 5, f"compose has {len(services)} services, not 5")
for name, service in services.items():
    build = service.get("build")
    if build:
        context = os.path.normpath(os.path.join("deploy", build["context"]))
        check(os.path.isfile(os.path.join(context, build.get("dockerfile", "Dockerfile"))),
              f"compose {name}: no Dockerfile in build context {context}")
    for port in service.get("ports", []):
        check(str(port).startswith("127.0.0.1:"), f"compose {name}: port {port} is not bound to 127.0.0.1")
    identity = None
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            path = os.path.normpath(os.path.join("deploy", source))
            check(os.path.exists(path), f"compose {name}: mounts {source}, which does not exist")
            if target == "/data/identity.pem":
                identity = os.path.basename(os.path.dirname(path))
        else:
            check(source in (compose.get("volumes") or {}), f"compose {name}: volume {source} is not declared")
    command = service.get("command", [])
    check("--config" in command and "/etc/meshwire/meshwire.toml" in command,
          f"compose {name}: does not run the mounted config")
    check("healthcheck" in service, f"compose {name}: no healthcheck")
    address = service["networks"]["mesh"]["ipv4_address"]
    check(identity in ids, f"compose {name}: mounts no deploy/config/nodeN/identity.pem")
    if identity in ids:
        check(peer_addresses.get(address) == ids[identity],
              f"compose {name}: its address {address} and identity {identity} are not a peer entry of the config")
        check(ids[identity] in config["objects"]["members"], f"compose {name}: not an object member")
        check(ids[identity] in config.get("allowlist", [ids[identity]]), f"compose {name}: not allowlisted")

# Kubernetes.
objects = [doc for path in documents if path.startswith("deploy/k8s/") for doc in documents[path] if doc]
objects += [yaml.safe_load(open(os.path.join(work, "k8s", f))) for f in ("configmap.yaml", "secret.yaml")]
by_kind = {}
for obj in objects:
    by_kind.setdefault(obj["kind"], []).append(obj)
for kind in ("Service", "StatefulSet", "ConfigMap", "Secret"):
    check(kind in by_kind, f"deploy/k8s has no {kind}")
if "Service" in by_kind and "StatefulSet" in by_kind:
    service, statefulset = by_kind["Service"][0], by_kind["StatefulSet"][0]
    check(service["spec"].get("clusterIP") == "None", "the Service is not headless")
    spec = statefulset["spec"]
    check(spec["serviceName"] == service["metadata"]["name"], "the StatefulSet does not name the headless Service")
    labels = spec["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in service["spec"]["selector"].items()), "the Service does not select the pods")
    annotations = spec["template"]["metadata"].get("annotations", {})
    check(annotations.get("prometheus.io/scrape") == "true", "pods lack prometheus.io/scrape: \"true\"")
    check(annotations.get("prometheus.io/port") == "7780", "pods lack prometheus.io/port")
    check(spec.get("volumeClaimTemplates"), "the StatefulSet has no persistent volume claim templates")
    claims = {claim["metadata"]["name"] for claim in spec.get("volumeClaimTemplates", [])}
    pod = spec["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    check(pod.get("securityContext", {}).get("runAsNonRoot") is True, "pods may run as root")
    for container in pod["containers"]:
        for probe in ("readinessProbe", "livenessProbe"):
            check(probe in container, f"container {container['name']} has no {probe}")
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        check(mounts.get("/data", {}).get("name") in claims, "/data is not a persistent volume claim")
        args = container.get("args", [])
        config_path = args[args.index("--config") + 1] if "--config" in args else None
        check(config_path and os.path.dirname(config_path) in mounts, "the --config file is not mounted")
        for mount in mounts.values():
            name = mount["name"]
            check(name in volumes or name in claims, f"volume mount {name} has no volume")
    config_maps = {cm["metadata"]["name"] for cm in by_kind.get("ConfigMap", [])}
    secrets = {s["metadata"]["name"] for s in by_kind.get("Secret", [])}
    for volume in volumes.values():
        if "configMap" in volume:
            check(volume["configMap"]["name"] in config_maps, f"ConfigMap {volume['configMap']['name']} is not made")
        if "secret" in volume:
            check(volume["secret"]["secretName"] in secrets, f"Secret {volume['secret']['secretName']} is not made")
    check(len(by_kind["Secret"][0]["stringData"]) == spec["replicas"], "generate.sh made a key per pod")

# Grafana: parses, and every metric it queries is registered in the code.
dashboard = json.load(open("deploy/grafana/meshwire.json"))
exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
check(exprs, "the Grafana dashboard queries nothing")
metrics = sorted({m for e in exprs for m in re.findall(r"\bmeshwire_[a-z0-9_]+", e)})
sources = "\n".join(open(f).read() for f in glob.glob("crates/*/src/**/*.rs", recursive=True))
def registered(metric):
    name = re.sub(r"_(bucket|sum|count)$", "", metric.removeprefix("meshwire_"))
    name = name.removesuffix("_total")
    candidates = {name, name.removesuffix("_bytes"), name.removesuffix("_seconds")}
    # meshwire-gossip registers under the sub-registry prefix "gossip".
    candidates |= {c.removeprefix("gossip_") for c in candidates if c.startswith("gossip_")}
    return any(re.search(r'\.register(_with_unit)?\(\s*"%s"|^\s*\("%s",|"%s",\s*\n\s*"' % (c, c, c), sources, re.M)
               for c in candidates)
missing = [m for m in metrics if not registered(m)]
if check(not missing, f"the Grafana dashboard queries metrics not registered in the code: {missing}"):
    print(f"Grafana: {len(dashboard['panels'])} panels, {len(exprs)} queries over {len(metrics)} metrics, all registered in the code")

for problem in problems:
    print(f"FAILED: {problem}")
print(f"{len(problems)} structural problems")
sys.exit(1 if problems else 0)
PY

if [ "$failures" -eq 0 ]; then
  echo "check-deploy: ok"
else
  echo "check-deploy: $failures failed"
  exit 1
fi
