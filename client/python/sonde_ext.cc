// sonde._sonde: the C++ hook (client/hook.h) for Python, through pybind11.
//
// The Python side (sonde/torch/hook.py) turns framework tensors into raw
// pointers, dtypes and shapes; everything else (statistics, histograms,
// chunking, streaming, retries) happens here and on the hook's own
// threads. Every call that does real work releases the GIL, so training
// threads and the hook's threads never wait on each other through Python.
//
// Options arrive as one JSON document (sonde/torch/hook.py builds it), so
// the binding stays small and option parsing is tested in one place.
// Errors: bad options raise ValueError; saving never raises, it returns
// None or (status code name, message) and the Python side decides.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/hook.h"
#include "glog/logging.h"
#include "client/python/options_json.h"
#include "common/crc32c.h"
#include "common/tensor_chunks.h"
#include "cuda/device_stats.h"

namespace py = pybind11;

namespace sonde {
namespace {

py::object StatusToPython(const absl::Status& s) {
  if (s.ok()) return py::none();
  return py::make_tuple(std::string(absl::StatusCodeToString(s.code())),
                        std::string(s.message()));
}

// Runs `f` (returning absl::Status) with the GIL released.
template <typename F>
py::object WithoutGil(F f) {
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = f();
  }
  return StatusToPython(s);
}

TensorView ToView(uintptr_t data, int dtype, std::vector<int64_t> shape, int device,
                  int device_index, uintptr_t stream) {
  TensorView v;
  v.data = reinterpret_cast<const void*>(data);
  v.dtype = static_cast<v1::DType>(dtype);
  v.shape = std::move(shape);
  v.device = device == 1 ? Device::kCuda : Device::kHost;
  v.device_index = device_index;
  v.stream = reinterpret_cast<void*>(stream);
  return v;
}

// The Python object: owns the hook; every method is safe after close().
class PyHook {
 public:
  static std::unique_ptr<PyHook> Create(const std::string& options_json) {
    absl::StatusOr<std::unique_ptr<Hook>> hook;
    {
      absl::StatusOr<PythonHookOptions> parsed = ParsePythonHookOptions(options_json);
      if (!parsed.ok()) throw py::value_error(std::string(parsed.status().message()));
      py::gil_scoped_release release;
      if (parsed->config_file.empty()) {
        hook = Hook::Create(std::move(parsed->options));
      } else {
        hook = Hook::CreateFromJsonFile(parsed->config_file, std::move(parsed->options));
      }
    }
    if (!hook.ok()) throw py::value_error(std::string(hook.status().message()));
    return std::unique_ptr<PyHook>(new PyHook(std::move(*hook)));
  }

  void StartStep() { hook_->StartStep(); }
  void EndStep() { hook_->EndStep(); }
  void FenceDevice() { hook_->FenceDevice(); }
  void SetMode(int mode) { hook_->SetMode(static_cast<v1::Mode>(mode)); }
  int Mode() const { return hook_->mode(); }
  int64_t Step() const { return hook_->step(); }
  int64_t ModeStep() const { return hook_->mode_step(); }
  bool StepMaySave() { return hook_->StepMaySave(); }
  std::vector<std::string> DueCollections() { return hook_->DueCollections(); }
  std::vector<std::vector<std::string>> CollectionsOf(const std::vector<std::string>& names) {
    return hook_->CollectionsOf(names);
  }
  uint64_t CollectionsVersion() { return hook_->collections_version(); }
  bool ShouldSave(const std::string& name, const std::vector<std::string>& collections) {
    return hook_->ShouldSave(name, collections);
  }

  py::object Save(const std::string& name, uintptr_t data, int dtype, std::vector<int64_t> shape,
                  const std::vector<std::string>& collections, int device, int device_index,
                  uintptr_t stream) {
    return WithoutGil([&] {
      return hook_->SaveTensor(
          name, ToView(data, dtype, std::move(shape), device, device_index, stream), collections);
    });
  }

  // items: (name, data, dtype, shape, collections, device, device_index, stream)
  py::object SaveMany(const py::list& items) {
    std::vector<NamedTensor> tensors;
    tensors.reserve(items.size());
    for (const py::handle& item : items) {
      auto t = item.cast<std::tuple<std::string, uintptr_t, int, std::vector<int64_t>,
                                    std::vector<std::string>, int, int, uintptr_t>>();
      tensors.push_back(NamedTensor{
          std::move(std::get<0>(t)),
          ToView(std::get<1>(t), std::get<2>(t), std::move(std::get<3>(t)), std::get<5>(t),
                 std::get<6>(t), std::get<7>(t)),
          std::move(std::get<4>(t))});
    }
    return WithoutGil([&] { return hook_->SaveTensors(tensors); });
  }

  py::object SaveScalar(const std::string& name, double value,
                        const std::vector<std::string>& collections) {
    return WithoutGil([&] { return hook_->SaveScalar(name, value, collections); });
  }

  void AddToCollection(const std::string& collection, const std::string& name) {
    hook_->AddToCollection(collection, name);
  }
  void IncludeCollection(const std::string& collection) { hook_->IncludeCollection(collection); }

  py::object WaitUntilConnected(double seconds) {
    return WithoutGil([&] { return hook_->WaitUntilConnected(absl::Seconds(seconds)); });
  }
  py::object Flush(double seconds) {
    return WithoutGil([&] { return hook_->Flush(absl::Seconds(seconds)); });
  }
  py::object Close() {
    return WithoutGil([&] { return hook_->Close(); });
  }

  // A framework event for the profiler (kind: proto TraceEvent.Kind);
  // step -1: the hook's current step.
  void RecordEvent(int kind, const std::string& name, int64_t start_us, int64_t end_us) {
    v1::TraceEvent e;
    e.set_kind(static_cast<v1::TraceEvent::Kind>(kind));
    e.set_name(name);
    e.set_step(-1);
    e.set_start_unix_micros(start_us);
    e.set_end_unix_micros(end_us);
    hook_->RecordEvent(std::move(e));
  }

  void SetProfilerGauge(const std::string& name, double value) {
    hook_->SetProfilerGauge(name, value);
  }

  bool ShouldStop() const { return hook_->should_stop(); }

  py::object StopAction() const {
    std::optional<v1::Action> a = hook_->stop_action();
    if (!a.has_value()) return py::none();
    py::dict d;
    d["rule"] = a->rule();
    d["reason"] = a->reason();
    d["step"] = a->step();
    d["status"] = a->has_verdict() ? static_cast<int>(a->verdict().status()) : 0;
    return std::move(d);
  }

  py::dict Counters() const {
    const Hook::Counters c = hook_->counters();
    py::dict d;
    d["tensors_saved"] = c.tensors_saved;
    d["tensors_dropped"] = c.tensors_dropped;
    d["values_dropped"] = c.values_dropped;
    d["device_batches"] = c.device_batches;
    d["device_waits"] = c.device_waits;
    d["device_waited_seconds"] = absl::ToDoubleSeconds(c.device_waited);
    d["device_snapshot_bytes_peak"] = c.device_snapshot_bytes_peak;
    d["device_bytes_downloaded"] = c.device_bytes_downloaded;
    d["device_values_spilled"] = c.device_values_spilled;
    d["device_bytes_spilled"] = c.device_bytes_spilled;
    d["device_enqueue_seconds"] = absl::ToDoubleSeconds(c.device_enqueue_time);
    d["device_engine_seconds"] = absl::ToDoubleSeconds(c.device_engine_time);
    d["device_handover_seconds"] = absl::ToDoubleSeconds(c.device_handover_time);
    d["steps_dropped"] = c.steps_dropped;
    d["tensors_spilled"] = c.tensors_spilled;
    d["bytes_spilled"] = c.bytes_spilled;
    d["steps"] = c.steps;
    d["messages_sent"] = c.messages_sent;
    d["messages_resent"] = c.messages_resent;
    d["steps_acked"] = c.steps_acked;
    d["duplicates_acked"] = c.duplicates_acked;
    d["reconnects"] = c.reconnects;
    d["memory_bytes"] = c.memory_bytes;
    d["profile_batches_queued"] = c.profile_batches_queued;
    d["profile_batches_dropped"] = c.profile_batches_dropped;
    d["entries_spooled"] = c.entries_spooled;
    d["spool_refused"] = c.spool_refused;
    d["spool_bytes"] = c.spool_bytes;
    d["steps_left_in_spool"] = c.steps_left_in_spool;
    d["left_spools_uploaded"] = c.left_spools_uploaded;
    d["left_steps_uploaded"] = c.left_steps_uploaded;
    return d;
  }

 private:
  explicit PyHook(std::unique_ptr<Hook> hook) : hook_(std::move(hook)) {}

 public:
  // Python drops the object with the GIL held; ~Hook may wait for the
  // collector (close_timeout), which must not stall other Python threads.
  ~PyHook() {
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release release;
      hook_.reset();
    }
  }

 private:
  std::unique_ptr<Hook> hook_;
};

}  // namespace
}  // namespace sonde

PYBIND11_MODULE(_sonde, m) {
  using sonde::PyHook;
  // The hook logs through glog: to stderr, as before, and without glog's
  // "Logging before InitGoogleLogging()" warning opening every run.
  if (!google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    google::InitGoogleLogging("sonde");
  }
  m.doc() = "Sonde's C++ client hook (internal; use sonde.torch.Hook)";
  m.def("check_options", [](const std::string& options_json) {
    absl::StatusOr<sonde::PythonHookOptions> parsed = sonde::ParsePythonHookOptions(options_json);
    if (!parsed.ok()) return sonde::StatusToPython(parsed.status());
    sonde::HookOptions options = std::move(parsed->options);
    if (!parsed->config_file.empty()) {
      absl::StatusOr<sonde::HookOptions> applied =
          sonde::Hook::ApplyJsonFile(parsed->config_file, std::move(options));
      if (!applied.ok()) return sonde::StatusToPython(applied.status());
      options = std::move(*applied);
    }
    return sonde::StatusToPython(sonde::Hook::Validate(options));
  }, py::arg("options_json"), "None if a hook could be created with these options, else (code, why)");
  m.def("crc32c", [](py::buffer data) {
    // The collector's own CRC-32C (common/crc32c.h, SSE4.2 where present),
    // so sonde.trials checks chunks with the implementation that made them.
    py::buffer_info info = data.request();
    const size_t n = static_cast<size_t>(info.size) * static_cast<size_t>(info.itemsize);
    py::gil_scoped_release release;
    return sonde::Crc32cExtend(0, info.ptr, n);
  }, py::arg("data"), "CRC-32C (Castagnoli) of a contiguous bytes-like object, as an int");
  // The collector's chunk checks (common/tensor_chunks.h) for sonde.trials'
  // ReadTensor streams: one implementation of reassembly, not two.
  py::class_<sonde::TensorAssembler>(m, "TensorAssembler")
      .def(py::init([](uint64_t max_chunk_bytes, uint64_t max_tensor_bytes) {
             return sonde::TensorAssembler(
                 sonde::TensorAssembler::Limits{max_chunk_bytes, max_tensor_bytes});
           }),
           py::arg("max_chunk_bytes"), py::arg("max_tensor_bytes"))
      .def("add", [](sonde::TensorAssembler& a, py::bytes serialized) -> py::object {
        // The chunk as TensorChunk.SerializeToString() gives it: Python's
        // and C++'s protobuf runtimes share no objects.
        const std::string_view view(serialized);
        sonde::v1::TensorChunk chunk;
        if (!chunk.ParseFromArray(view.data(), static_cast<int>(view.size()))) {
          return sonde::StatusToPython(absl::InvalidArgumentError("not a TensorChunk"));
        }
        absl::Status s;
        {
          py::gil_scoped_release release;  // the CRC and copy of the payload
          s = a.Add(chunk);
        }
        return sonde::StatusToPython(s);
      }, py::arg("serialized_chunk"), "None if the chunk was accepted, else (code, why)")
      .def_property_readonly("complete", &sonde::TensorAssembler::complete)
      .def_property_readonly("chunks_received", &sonde::TensorAssembler::chunks_received)
      .def_property_readonly("bytes_received",
                             [](const sonde::TensorAssembler& a) { return a.bytes().size(); })
      .def("header", [](const sonde::TensorAssembler& a) {
        return py::bytes(a.header().SerializeAsString());
      }, "chunk 0 without its payload, serialized")
      .def("take_bytes", [](sonde::TensorAssembler& a) {
        std::string bytes = a.TakeBytes();  // a bytearray: numpy arrays over it are writable
        return py::bytearray(bytes.data(), bytes.size());
      }, "the tensor's bytes (once)");
  m.def("probe_device", [](int device) {
    return sonde::WithoutGil([&] { return sonde::DeviceStats::Probe(device); });
  }, py::arg("device"), "None if CUDA device `device` can be measured, else (code, why)");
  py::class_<PyHook>(m, "Hook")
      .def_static("create", &PyHook::Create, py::arg("options_json"))
      .def("start_step", &PyHook::StartStep, py::call_guard<py::gil_scoped_release>())
      .def("end_step", &PyHook::EndStep, py::call_guard<py::gil_scoped_release>())
      .def("fence_device", &PyHook::FenceDevice, py::call_guard<py::gil_scoped_release>())
      .def("set_mode", &PyHook::SetMode, py::call_guard<py::gil_scoped_release>())
      .def("mode", &PyHook::Mode)
      .def("step", &PyHook::Step)
      .def("mode_step", &PyHook::ModeStep)
      .def("step_may_save", &PyHook::StepMaySave, py::call_guard<py::gil_scoped_release>())
      .def("due_collections", &PyHook::DueCollections)
      .def("collections_of", &PyHook::CollectionsOf)
      .def("collections_version", &PyHook::CollectionsVersion)
      .def("should_save", &PyHook::ShouldSave)  // a lookup: not worth releasing the GIL
      .def("save", &PyHook::Save)
      .def("save_many", &PyHook::SaveMany)
      .def("save_scalar", &PyHook::SaveScalar)
      .def("add_to_collection", &PyHook::AddToCollection)
      .def("include_collection", &PyHook::IncludeCollection)
      .def("wait_until_connected", &PyHook::WaitUntilConnected)
      .def("flush", &PyHook::Flush)
      .def("close", &PyHook::Close)
      .def("record_event", &PyHook::RecordEvent, py::call_guard<py::gil_scoped_release>())
      .def("set_profiler_gauge", &PyHook::SetProfilerGauge)
      .def("should_stop", &PyHook::ShouldStop)
      .def("stop_action", &PyHook::StopAction)
      .def("counters", &PyHook::Counters);
}
