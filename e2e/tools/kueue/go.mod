// Wrapper module: builds Kueue at the version components/spec/versions.py pins (a test keeps them equal).
module gpucluster.e2e/kueue

go 1.26.0

require sigs.k8s.io/kueue v0.19.2
