#include <cstdlib>
#include <cstring>

#include "parallel/communicator.h"

namespace tandem {

void LocalCommunicator::all_gather(const void* in, void* out, size_t count) {
  if (in != out) std::memmove(out, in, count);
}

void LocalCommunicator::abort_job(int code) { std::exit(code); }

}  // namespace tandem
