// cuBLAS is loaded on demand (worker/cuda/cublas_api.h): not mapped into a
// process that never makes a CUDA backend, and every entry point resolves
// when it is loaded. Runs without a GPU (only the toolkit's library).
#include "worker/cuda/cublas_api.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace asyncps::worker::internal {
namespace {

bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream all;
  all << maps.rdbuf();
  return all.str().find(name) != std::string::npos;
}

TEST(CublasApiTest, LoadedOnDemandWithEveryEntryPoint) {
  // This process linked asyncps_worker: cuBLAS is not mapped until asked.
  ASSERT_FALSE(CublasLoaded()) << "an earlier test in this process loaded it";
  EXPECT_FALSE(Mapped("libcublas")) << "libcublas is linked again";

  StatusOr<const CublasApi*> api = LoadCublas();
  ASSERT_TRUE(api.ok()) << api.status().ToString();
  const CublasApi* a = *api;
  EXPECT_NE(a->create, nullptr);
  EXPECT_NE(a->destroy, nullptr);
  EXPECT_NE(a->set_stream, nullptr);
  EXPECT_NE(a->set_math_mode, nullptr);
  EXPECT_NE(a->sgemm, nullptr);
  EXPECT_TRUE(CublasLoaded());
  EXPECT_TRUE(Mapped("libcublas.so"));

  StatusOr<const CublasApi*> again = LoadCublas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, a);
}

}  // namespace
}  // namespace asyncps::worker::internal
