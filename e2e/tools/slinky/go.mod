// Wrapper module: the Slinky release components/spec/slurm.py pins (its charts and CRDs ship in the module).
module gpucluster.e2e/slinky

go 1.26.0

require github.com/SlinkyProject/slurm-operator v1.1.0
