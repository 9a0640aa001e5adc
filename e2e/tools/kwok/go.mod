// Wrapper module: builds KWOK (fake nodes and pod lifecycles) from the module proxy.
module gpucluster.e2e/kwok

go 1.26.0

require sigs.k8s.io/kwok v0.8.0
