// launch_runner.cc — host code: runs a recorded launch schedule (ftlab/launches.py) from C++.
//
// make_runner(functions, arguments) takes the schedule's tvm-ffi functions and, for each, its
// argument list (tensors, numbers, bools), holds them, and returns a function that calls every
// one in order: one call from Python instead of one a launch (each of those costs the host its
// arguments' conversion: benchmarks/NOTES.md, "Eager decode from a launch schedule"). The returned function takes one
// GPU tensor, which only tells tvm-ffi the device and stream: the caller's current stream is set
// for the duration of the call, so every launch goes to it, as when called one by one.
#include <memory>
#include <vector>

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

namespace ftlab {

using tvm::ffi::Any;
using tvm::ffi::AnyView;
using tvm::ffi::Array;
using tvm::ffi::Function;
using tvm::ffi::PackedArgs;

namespace {

struct Call {
  Function fn;
  std::vector<Any> held;        // the arguments, owned
  std::vector<AnyView> views;   // views of `held`, what a call takes
};

}  // namespace

Function make_runner(Array<Function> functions, Array<Array<Any>> arguments) {
  TVM_FFI_CHECK(functions.size() == arguments.size(), ValueError)
      << "make_runner: " << functions.size() << " functions but " << arguments.size() << " argument lists";
  auto calls = std::make_shared<std::vector<Call>>(functions.size());
  for (size_t i = 0; i < functions.size(); ++i) {
    Call& c = (*calls)[i];
    c.fn = functions[i];
    for (const Any& a : arguments[i]) c.held.push_back(a);
    for (const Any& a : c.held) c.views.emplace_back(a);
  }
  return Function::FromPacked([calls](PackedArgs args, Any* rv) {
    TVM_FFI_CHECK(args.size() == 1, TypeError) << "a runner takes one tensor (its device and stream)";
    for (const Call& c : *calls) {
      Any out;
      c.fn.CallPacked(c.views.data(), static_cast<int32_t>(c.views.size()), &out);
    }
  });
}

}  // namespace ftlab

TVM_FFI_DLL_EXPORT_TYPED_FUNC(make_runner, ftlab::make_runner);
