#pragma once
// Tensor-parallel ranks as MPI processes (OpenMPI from Debian): started by mpirun, on one machine
// or many. All-reduce, all-gather and broadcast map to the MPI collectives; a fatal error on any
// rank ends the whole job through MPI_Abort, so no rank is left waiting in a collective.
#include <memory>

#include "parallel/communicator.h"

namespace tandem {

// True when this process was started by mpirun/mpiexec (OpenMPI, MPICH or a PMI launcher).
bool launched_by_mpi();

// An MPI communicator when launched by mpirun (initializing MPI), else a LocalCommunicator.
// Errors if launched by mpirun but Tandem was built without MPI.
std::unique_ptr<Communicator> make_world_communicator(int* argc, char*** argv);

// How many ranks of this job run on this machine (to share its cores between them).
int local_rank_count();

}  // namespace tandem
