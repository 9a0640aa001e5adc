// Wrapper module: builds the MPI operator at the version components/spec/kubernetes.py pins (a test keeps them equal).
module gpucluster.e2e/mpi-operator

go 1.26.0

require github.com/kubeflow/mpi-operator v0.8.2
