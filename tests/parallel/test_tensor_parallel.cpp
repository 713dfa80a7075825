// Tensor parallelism under mpirun: TP=2 and TP=4 give the greedy ids of TP=1 exactly and logits
// within 1e-4, on an E4B-like checkpoint (2 KV heads: split) and an E2B-like one (1 KV head:
// replicated), over shared memory and over OpenMPI's TCP transport (the path between machines).
#include <gtest/gtest.h>
#include <unistd.h>

#include "support/test_support.h"

namespace tandem {
namespace {

using nlohmann::json;

bool have_mpirun() { return test::run("command -v mpirun").exit_code == 0; }

std::string mpirun(int ranks, const std::string& extra = "") {
  std::string cmd = "mpirun --oversubscribe -np " + std::to_string(ranks) + " " + extra + " ";
  if (::geteuid() == 0) cmd += "--allow-run-as-root ";
  return cmd;
}

const std::string kIds = "2,17,5,100,200,300,44,55,66,77,88,99,111,222,333,444,12,13,14,15,16,17,18,19,20,21,22,23,24,25";

json tandem_json(const std::string& launcher, const std::string& args) {
  auto r = test::run(launcher + test::shell_quote(test::tandem_binary()) + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

class TensorParallel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (apt-get install openmpi-bin)";
    model_ = test::checkpoint_for(GetParam());
  }
  std::string model_;
};

TEST_P(TensorParallel, GreedyIdsEqualSingleRank) {
  const std::string args = "generate --model " + model_ + " --ids " + kIds + " --max-tokens 24 --ignore-eos --threads 1";
  const json single = tandem_json("", args);
  for (int ranks : {2, 4}) EXPECT_EQ(tandem_json(mpirun(ranks), args)["ids"], single["ids"]) << "TP=" << ranks;
  EXPECT_EQ(tandem_json(mpirun(2, "--mca btl self,tcp --mca btl_tcp_if_include lo"), args)["ids"], single["ids"])
      << "TP=2 over TCP";
}

TEST_P(TensorParallel, LogitsWithin1e4OfSingleRank) {
  const std::string args = "logits --model " + model_ + " --ids " + kIds + " --threads 1";
  const json single = tandem_json("", args);
  for (int ranks : {2, 4}) {
    const json tp = tandem_json(mpirun(ranks), args);
    ASSERT_EQ(tp["logits"].size(), single["logits"].size());
    double worst = 0;
    for (size_t p = 0; p < single["logits"].size(); ++p)
      for (size_t v = 0; v < single["logits"][p].size(); ++v)
        worst = std::max(worst, std::abs(tp["logits"][p][v].get<double>() - single["logits"][p][v].get<double>()));
    EXPECT_LE(worst, 1e-4) << "TP=" << ranks;
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, TensorParallel, ::testing::Values("golden", "tiny-e2b", "tiny-odd"),
                         [](const auto& info) { return test::checkpoint_label(info.param); });

TEST(TensorParallelErrors, AFailingRankEndsTheJob) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not found";
  // Every rank fails to open the model: the job must end (not hang) with a clear message.
  auto r = test::run("timeout 60 " + mpirun(2) + test::shell_quote(test::tandem_binary()) +
                     " generate --model /nonexistent --ids 2 --max-tokens 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung";
  EXPECT_NE((r.out + r.err).find("/nonexistent"), std::string::npos);
}

}  // namespace
}  // namespace tandem
