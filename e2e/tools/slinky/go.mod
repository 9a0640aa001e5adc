// Wrapper module: the Slinky release components/spec/slurm.py pins (its charts and CRDs ship in the module), and
// its operator, built for make e2e. The module proxy refuses slurm-client v1.1.0, the REST client the operator
// talks to slurmrestd with; v1.1.0-rc1 builds it unchanged (make e2e runs it against Slurm 26.05's slurmrestd).
module gpucluster.e2e/slinky

go 1.26.1

require github.com/SlinkyProject/slurm-operator v1.1.0

replace github.com/SlinkyProject/slurm-client => github.com/SlinkyProject/slurm-client v1.1.0-rc1
