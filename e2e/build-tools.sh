#!/usr/bin/env bash
# Builds the real control plane for `make e2e` from Go modules only (the module proxy; no prebuilt downloads):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, KWOK, Kueue, the MPI operator,
# node-problem-detector, helm and Slinky's slurm-operator, at the versions pinned in e2e/tools/*/go.mod, and
# Slinky's charts from its module; and the Slurm release that operator talks to (e2e/build-slurm-root.sh).
# A binary is rebuilt only when its wrapper module changed, so later runs take seconds.
# Usage: e2e/build-tools.sh [OUT_DIR]   (default .e2e; binaries in OUT_DIR/bin; KWOK stages, the CRDs of Kueue,
# the MPI operator and the Prometheus Operator beside)
#        e2e/build-tools.sh OUT_DIR engine   (only the real engine for `make engine-e2e`: the Pulumi CLI, its YAML and
# Python language hosts and the Kubernetes provider; about 30 minutes cold: CI builds them at low priority)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-.e2e}")
tools=$PWD/e2e/tools
own_stages=$PWD/e2e/kwok-stages      # KWOK stages of our own, beside those KWOK ships
mkdir -p "$out/bin"
[[ -x /usr/local/go/bin/go ]] && PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null 2>&1 || { echo "build-tools: no 'go' on PATH; install Go 1.21 or later (it fetches the" \
  "go1.26 toolchain the modules need through the module proxy)" >&2; exit 1; }

# Go 1.21 and later fetch the toolchain the wrapper modules name (go 1.26) through the module proxy.
export CGO_ENABLED=0 GOFLAGS=-mod=mod
# The checksum database does not know this Kueue dependency; the proxy serves it and go.sum pins it.
export GONOSUMDB=sigs.k8s.io/scheduler-library
log=$out/bin/BUILD.txt
touch "$log"

# stamp MODULE: what a binary was built from (its wrapper's go.mod pins every version; go.sum only records them;
# a wrapper's own main package, where it has one, is part of it)
stamp() {
  local files=("$tools/$1/go.mod") f
  for f in "$tools/$1"/*.go; do
    if [[ -e $f ]]; then files+=("$f"); fi
  done
  cat "${files[@]}" | sha256sum | cut -c1-16
}

# Built binaries are kept once per machine, outside any clone, under their name and stamp: a fresh clone (a CI
# run) copies them instead of building again. GPUCLUSTER_TOOL_CACHE moves it; removing it forces a rebuild.
cache=${GPUCLUSTER_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpucluster/tools}
mkdir -p "$cache"

# build MODULE BINARY PACKAGE [LDFLAGS [BEFORE]]: BEFORE, a command run first when the binary must be built
build() {
  local module=$1 bin=$2 pkg=$3 ldflags=${4:-} before=${5:-}
  local stamp; stamp=$(stamp "$module")
  if [[ -x $out/bin/$bin && $(cat "$out/bin/.$bin.stamp" 2>/dev/null) == "$stamp" ]]; then
    return 0
  fi
  local cached=$cache/$bin-$stamp
  if [[ ! -x $cached ]]; then
    local start=$SECONDS
    echo "build-tools: building $bin ($pkg)" >&2
    if [[ -n $before ]]; then "$before"; fi
    (cd "$tools/$module" && go build -trimpath -ldflags "-s -w $ldflags" -o "$cached.tmp.$$" "$pkg")
    mv "$cached.tmp.$$" "$cached"
    local size; size=$(du -m "$cached" | cut -f1)
    printf '%s\t%ss\t%sMiB\t%s\n' "$bin" "$((SECONDS - start))" "$size" "$(date -u +%FT%TZ)" >>"$log"
    echo "build-tools: $bin built in $((SECONDS - start)) s, $size MiB (kept in $cache)" >&2
  fi
  cp "$cached" "$out/bin/$bin.tmp"
  mv "$out/bin/$bin.tmp" "$out/bin/$bin"
  echo "$stamp" >"$out/bin/.$bin.stamp"
}

# module_dir MODULE PATH@VERSION: where the module proxy unpacked a dependency (for files shipped beside the code).
module_dir() {
  (cd "$tools/$1" && go mod download -json "$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
}

if [[ ${2:-} == engine ]]; then
  build pulumi pulumi github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
  build pulumi-yaml pulumi-language-yaml github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml
  # The Python language host of sdk/v3 v3.78.0 and, beside it (where that host looks, not on PATH), the exec
  # script of the engine's own sdk release, which pip's pulumi does not ship.
  build pulumi-language-python pulumi-language-python github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python
  engine_sdk=$(module_dir pulumi "github.com/pulumi/pulumi/sdk/v3@$(awk '$1 == "github.com/pulumi/pulumi/sdk/v3" {print $2}' \
    "$tools/pulumi/go.mod")")
  install -m 0755 "$engine_sdk/python/cmd/pulumi-language-python-exec" "$out/bin/pulumi-language-python-exec"
  # The Kubernetes provider: its main package's embedded schema and mapping, made as its generate.go makes them
  # (VERSION is the plugin version the binary reports), then the wrapper's copy of that main package.
  k8s_plugin_version=$(sed -n 's/^\/\/ plugin version: \(.*\)$/\1/p' "$tools/pulumi-kubernetes/go.mod")
  # shellcheck disable=SC2317  # called by build, only when the provider is built
  k8s_embeds() {
    local provider k8s_cmd
    provider=$(sed -n 's/^require github.com\/pulumi\/pulumi-kubernetes\/provider\/v4 \(v[0-9a-f.-]*\)$/\1/p' \
      "$tools/pulumi-kubernetes/go.mod")
    k8s_cmd=$(module_dir pulumi-kubernetes "github.com/pulumi/pulumi-kubernetes/provider/v4@$provider")
    k8s_cmd+=/cmd/pulumi-resource-kubernetes
    cp "$k8s_cmd/schema.json" "$k8s_cmd/terraform-mapping.json" "$tools/pulumi-kubernetes/"
    chmod u+w "$tools/pulumi-kubernetes/schema.json" "$tools/pulumi-kubernetes/terraform-mapping.json"
    (cd "$tools/pulumi-kubernetes" && VERSION=$k8s_plugin_version go run "$k8s_cmd/generate.go")
    rm "$tools/pulumi-kubernetes/schema.json" "$tools/pulumi-kubernetes/terraform-mapping.json"
  }
  build pulumi-kubernetes pulumi-resource-kubernetes . \
    "-X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$k8s_plugin_version" k8s_embeds
  exit 0
fi

# Slurm's daemons for the operator's rollout test (network bound: made while the binaries build).
e2e/build-slurm-root.sh "$out" &
slurm_root=$!

k8s_version=$(sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$tools/kubernetes/go.mod")
IFS=. read -r k8s_major k8s_minor _ <<<"${k8s_version#v}"
k8s_ld="-X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=$k8s_major"
k8s_ld+=" -X k8s.io/component-base/version.gitMinor=$k8s_minor -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
k8s_ld+=" -X k8s.io/component-base/version.gitTreeState=clean"

build etcd etcd go.etcd.io/etcd/server/v3
for cmd in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  build kubernetes "$cmd" "k8s.io/kubernetes/cmd/$cmd" "$k8s_ld"
done
build kwok kwok sigs.k8s.io/kwok/cmd/kwok
kueue_version=$(sed -n 's/^require sigs.k8s.io\/kueue \(v[0-9.]*\)$/\1/p' "$tools/kueue/go.mod")
build kueue kueue sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
mpi_version=$(sed -n 's/^require github.com\/kubeflow\/mpi-operator \(v[0-9.]*\)$/\1/p' "$tools/mpi-operator/go.mod")
build mpi-operator mpi-operator github.com/kubeflow/mpi-operator/cmd/mpi-operator
build node-problem-detector node-problem-detector k8s.io/node-problem-detector/cmd/nodeproblemdetector
build helm helm helm.sh/helm/v3/cmd/helm
build slinky slurm-operator github.com/SlinkyProject/slurm-operator/cmd/manager

# Files the modules ship beside their code: KWOK's stages, Kueue's CRDs and webhook configurations, copied so runs need no module cache.
kwok_dir=$(module_dir kwok "sigs.k8s.io/kwok@$(sed -n 's/^require sigs.k8s.io\/kwok \(v[0-9.]*\)$/\1/p' "$tools/kwok/go.mod")")
kueue_dir=$(module_dir kueue "sigs.k8s.io/kueue@$kueue_version")
mpi_dir=$(module_dir mpi-operator "github.com/kubeflow/mpi-operator@$mpi_version")
rm -rf "$out/kwok-stages" "$out/kueue-crds" "$out/kueue-webhooks" "$out/mpi-operator-crds"
mkdir -p "$out/kwok-stages" "$out/kueue-crds" "$out/kueue-webhooks" "$out/mpi-operator-crds"
# Pods become Running and stay so until deleted (no pod-complete stage): admitted jobs keep holding their quota.
# A deleted pod turns terminal first, as a kubelet makes it (e2e/kwok-stages: ours), then goes.
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready; do
  cp "$kwok_dir/kustomize/stage/$stage.yaml" "$out/kwok-stages/"
done
cp "$own_stages"/*.yaml "$out/kwok-stages/"
cp "$kueue_dir"/config/components/crd/bases/*.yaml "$out/kueue-crds/"
cp "$kueue_dir"/config/components/webhook/manifests.yaml "$out/kueue-webhooks/"
# The MPIJob CRD at the path the stack's ConfigFile fetches from the same release.
cp "$mpi_dir/manifests/base/kubeflow.org_mpijobs.yaml" "$out/mpi-operator-crds/"
chmod -R u+w "$out/kwok-stages" "$out/kueue-crds" "$out/kueue-webhooks" "$out/mpi-operator-crds"
# Slinky's charts as its release publishes them: the operator's with its CRD chart as the dependency it packages,
# the cluster's with the templates Go's module zip leaves out (any directory named vendor; e2e/slinky-vendor).
slinky_dir=$(module_dir slinky "github.com/SlinkyProject/slurm-operator@$(sed -n \
  's/^require github.com\/SlinkyProject\/slurm-operator \(v[0-9.]*\)$/\1/p' "$tools/slinky/go.mod")")
rm -rf "$out/slinky-charts"
mkdir -p "$out/slinky-charts"
cp -r "$slinky_dir/helm/slurm-operator" "$slinky_dir/helm/slurm" "$out/slinky-charts/"
chmod -R u+w "$out/slinky-charts"
mkdir -p "$out/slinky-charts/slurm-operator/charts" "$out/slinky-charts/slurm/templates/vendor/nvidia/dcgm"
cp -r "$slinky_dir/helm/slurm-operator-crds" "$out/slinky-charts/slurm-operator/charts/"
cp e2e/slinky-vendor/*.tpl e2e/slinky-vendor/*.yaml "$out/slinky-charts/slurm/templates/vendor/nvidia/dcgm/"
chmod -R u+w "$out/slinky-charts"
# The Prometheus Operator's ServiceMonitor and PrometheusRule CRDs, of the API release the Slinky operator is built
# with: the ServiceMonitor it makes and the stack's alert rules go through them.
prom_version=$(sed -n 's/^\tgithub.com\/prometheus-operator\/prometheus-operator\/pkg\/apis\/monitoring \(v[0-9.]*\)$/\1/p' \
  "$slinky_dir/go.mod")
prom_dir=$(module_dir slinky "github.com/prometheus-operator/prometheus-operator@$prom_version")
rm -rf "$out/prometheus-operator-crds"
mkdir -p "$out/prometheus-operator-crds"
cp "$prom_dir"/example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,prometheusrules}.yaml \
  "$out/prometheus-operator-crds/"
chmod -R u+w "$out/prometheus-operator-crds"
echo "$kueue_version" >"$out/kueue-crds/VERSION"
wait "$slurm_root" || { echo "build-tools: the Slurm root was not made (e2e/build-slurm-root.sh)" >&2; exit 1; }
echo "build-tools: ready in $out; build times and sizes in $log" >&2
