// NVML through dlopen: see nvml.h. The declarations below are NVML's stable C interface (nvml.h,
// the _v2/_v3 entry points current drivers export), written out because the toolkit on the build
// machines ships no nvml.h; each struct and constant is the header's.
#include "metrics/nvml.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/log.h"

namespace tessera::metrics {
namespace {

using Return = int;  // nvmlReturn_t
constexpr Return kSuccess = 0;
using Device = void*;  // nvmlDevice_t
using EventSet = void*;

struct Utilization {  // nvmlUtilization_t
  unsigned int gpu, memory;
};
struct Memory {  // nvmlMemory_t (v1)
  unsigned long long total, free, used;
};
struct PciInfo {  // nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3)
  char bus_id_legacy[16];
  unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
struct EventData {  // nvmlEventData_t
  Device device;
  unsigned long long event_type, event_data;
  unsigned int gpu_instance_id, compute_instance_id;
};
constexpr int kClockSm = 1, kClockMem = 2;  // nvmlClockType_t
constexpr int kTemperatureGpu = 0;          // nvmlTemperatureSensors_t
constexpr int kEccUncorrected = 1, kEccCorrected = 0, kEccVolatile = 0;
constexpr unsigned long long kEventXidCriticalError = 0x8;  // nvmlEventTypeXidCriticalError

}  // namespace

struct Nvml::Api {
  Return (*init)();
  Return (*shutdown)();
  const char* (*error_string)(Return);
  Return (*count)(unsigned int*);
  Return (*handle)(unsigned int, Device*);
  Return (*name)(Device, char*, unsigned int);
  Return (*uuid)(Device, char*, unsigned int);
  Return (*serial)(Device, char*, unsigned int);
  Return (*pci)(Device, PciInfo*);
  Return (*utilization)(Device, Utilization*);
  Return (*memory)(Device, Memory*);
  Return (*clock)(Device, int, unsigned int*);
  Return (*max_clock)(Device, int, unsigned int*);
  Return (*temperature)(Device, int, unsigned int*);
  Return (*power)(Device, unsigned int*);
  Return (*energy)(Device, unsigned long long*);
  Return (*throttle)(Device, unsigned long long*);
  Return (*ecc)(Device, int, int, unsigned long long*);
  Return (*retired_pending)(Device, int*);
  Return (*remapped_rows)(Device, unsigned int*, unsigned int*, unsigned int*, unsigned int*);
  Return (*event_set_create)(EventSet*);
  Return (*register_events)(Device, unsigned long long, EventSet);
  Return (*event_wait)(EventSet, EventData*, unsigned int);
  Return (*event_set_free)(EventSet);
};

namespace {

// Resolves every entry point; the first missing one is named in *why. Optional ones (events,
// energy, row remapping: not on every GPU generation or driver) may stay null.
bool resolve(void* lib, Nvml::Api& a, std::string* why) {
  bool ok = true;
  auto need = [&](auto& fn, const char* symbol, bool required = true) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (fn == nullptr && required && ok) {
      *why = fmt::format("libnvidia-ml.so.1 lacks {}", symbol);
      ok = false;
    }
  };
  need(a.init, "nvmlInit_v2");
  need(a.shutdown, "nvmlShutdown");
  need(a.error_string, "nvmlErrorString");
  need(a.count, "nvmlDeviceGetCount_v2");
  need(a.handle, "nvmlDeviceGetHandleByIndex_v2");
  need(a.name, "nvmlDeviceGetName");
  need(a.uuid, "nvmlDeviceGetUUID");
  need(a.serial, "nvmlDeviceGetSerial");
  need(a.pci, "nvmlDeviceGetPciInfo_v3");
  need(a.utilization, "nvmlDeviceGetUtilizationRates");
  need(a.memory, "nvmlDeviceGetMemoryInfo");
  need(a.clock, "nvmlDeviceGetClockInfo");
  need(a.max_clock, "nvmlDeviceGetMaxClockInfo");
  need(a.temperature, "nvmlDeviceGetTemperature");
  need(a.power, "nvmlDeviceGetPowerUsage");
  // Renamed "clocks event reasons" in recent drivers, which keep the old name as an alias.
  need(a.throttle, "nvmlDeviceGetCurrentClocksEventReasons", false);
  if (a.throttle == nullptr) need(a.throttle, "nvmlDeviceGetCurrentClocksThrottleReasons", false);
  need(a.ecc, "nvmlDeviceGetTotalEccErrors");
  need(a.retired_pending, "nvmlDeviceGetRetiredPagesPendingStatus");
  need(a.energy, "nvmlDeviceGetTotalEnergyConsumption", false);
  need(a.remapped_rows, "nvmlDeviceGetRemappedRows", false);
  need(a.event_set_create, "nvmlEventSetCreate", false);
  need(a.register_events, "nvmlDeviceRegisterEvents", false);
  need(a.event_wait, "nvmlEventSetWait_v2", false);
  need(a.event_set_free, "nvmlEventSetFree", false);
  return ok;
}

// "00000000:19:00.0" and "0000:19:00.0" alike: the domain as a number, the rest lower case.
std::string normal_bus_id(const std::string& id) {
  const size_t colon = id.find(':');
  uint64_t domain = 0;
  if (colon == std::string::npos ||
      std::from_chars(id.data(), id.data() + colon, domain, 16).ptr != id.data() + colon) {
    return id;
  }
  std::string rest = id.substr(colon);
  std::transform(rest.begin(), rest.end(), rest.begin(), [](unsigned char c) { return std::tolower(c); });
  return fmt::format("{:x}", domain) + rest;
}

}  // namespace

std::unique_ptr<Nvml> Nvml::open(std::string* why) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *why = "the NVIDIA driver's libnvidia-ml.so.1 is not installed";
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  if (!resolve(lib, *api, why)) {
    dlclose(lib);
    return nullptr;
  }
  if (const Return r = api->init(); r != kSuccess) {
    *why = fmt::format("nvmlInit failed: {}", api->error_string(r));
    dlclose(lib);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(lib, std::move(api)));
}

Nvml::Nvml(void* library, std::unique_ptr<Api> api) : library_(library), api_(std::move(api)) {
  unsigned int n = 0;
  if (api_->count(&n) != kSuccess) n = 0;
  for (unsigned int i = 0; i < n; ++i) {
    Device d = nullptr;
    if (api_->handle(i, &d) != kSuccess) d = nullptr;
    devices_.push_back(d);
  }
  for (size_t i = 0; i < devices_.size(); ++i) identities_.push_back(identify(static_cast<int>(i)));
  xid_count_.assign(devices_.size(), 0);
  last_xid_.assign(devices_.size(), 0);
  if (api_->event_set_create != nullptr && api_->register_events != nullptr && api_->event_wait != nullptr &&
      api_->event_set_create(&events_) == kSuccess) {
    for (Device d : devices_) {
      if (d != nullptr && api_->register_events(d, kEventXidCriticalError, events_) != kSuccess) {
        log::warn("NVML: XID events cannot be watched on a GPU (not supported or not permitted)");
      }
    }
  }
}

Nvml::~Nvml() {
  if (events_ != nullptr && api_->event_set_free != nullptr) api_->event_set_free(events_);
  api_->shutdown();
  dlclose(library_);
}

GpuReading Nvml::identify(int index) const {
  GpuReading r;
  r.index = index;
  const Device d = devices_[index];
  if (d == nullptr) return r;
  char text[96];
  if (api_->name(d, text, sizeof(text)) == kSuccess) r.name = text;
  if (api_->uuid(d, text, sizeof(text)) == kSuccess) r.uuid = text;
  if (api_->serial(d, text, sizeof(text)) == kSuccess) r.serial = text;
  if (PciInfo pci{}; api_->pci(d, &pci) == kSuccess) r.pci_bus_id = pci.bus_id;
  return r;
}

int Nvml::index_of_pci_bus_id(const std::string& bus_id) const {
  for (const GpuReading& g : identities_) {
    if (!g.pci_bus_id.empty() && normal_bus_id(g.pci_bus_id) == normal_bus_id(bus_id)) return g.index;
  }
  return -1;
}

void Nvml::drain_xids() {
  if (events_ == nullptr) return;
  EventData e{};
  while (api_->event_wait(events_, &e, 0) == kSuccess) {  // 0 ms: only what has arrived
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i] == e.device && (e.event_type & kEventXidCriticalError)) {
        ++xid_count_[i];
        last_xid_[i] = static_cast<int>(e.event_data);
      }
    }
  }
}

GpuReading Nvml::read(int index) {
  if (index < 0 || index >= static_cast<int>(devices_.size()) || devices_[index] == nullptr) {
    GpuReading none;
    none.index = index;
    return none;
  }
  GpuReading r = identities_[index];
  drain_xids();
  r.xid_count = xid_count_[index];
  r.last_xid = last_xid_[index];
  Device d = devices_[index];
  const Api& a = *api_;
  if (Utilization u{}; a.utilization(d, &u) == kSuccess) r.gpu_util_pct = u.gpu, r.mem_copy_util_pct = u.memory;
  if (Memory m{}; a.memory(d, &m) == kSuccess) {
    r.fb_used_mib = static_cast<double>(m.used) / (1 << 20);
    r.fb_free_mib = static_cast<double>(m.free) / (1 << 20);
  }
  unsigned int v = 0;
  if (a.clock(d, kClockSm, &v) == kSuccess) r.sm_clock_mhz = v;
  if (a.max_clock(d, kClockSm, &v) == kSuccess) r.max_sm_clock_mhz = v;
  if (a.clock(d, kClockMem, &v) == kSuccess) r.mem_clock_mhz = v;
  if (a.temperature(d, kTemperatureGpu, &v) == kSuccess) r.temperature_c = v;
  if (a.power(d, &v) == kSuccess) r.power_w = v / 1000.0;  // milliwatts
  unsigned long long w = 0;
  if (a.energy != nullptr && a.energy(d, &w) == kSuccess) r.energy_mj = static_cast<double>(w);
  if (a.throttle != nullptr && a.throttle(d, &w) == kSuccess) r.throttle_reasons = w;
  if (a.ecc(d, kEccCorrected, kEccVolatile, &w) == kSuccess) r.ecc_sbe_volatile = w;
  if (a.ecc(d, kEccUncorrected, kEccVolatile, &w) == kSuccess) r.ecc_dbe_volatile = w;
  if (int pending = 0; a.retired_pending(d, &pending) == kSuccess) r.retired_pages_pending = pending != 0 ? 1 : 0;
  unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
  if (a.remapped_rows != nullptr && a.remapped_rows(d, &corrected, &uncorrected, &pending, &failed) == kSuccess) {
    r.remapped_rows_correctable = corrected, r.remapped_rows_uncorrectable = uncorrected;
    r.row_remap_pending = pending != 0, r.row_remap_failure = failed != 0;
  }
  return r;
}

GpuSampler::GpuSampler(std::unique_ptr<Nvml> nvml, int index, std::chrono::milliseconds period)
    : nvml_(std::move(nvml)), index_(index), period_(period), latest_(nvml_->read(index)) {
  thread_ = std::thread([this] { loop(); });
}

GpuSampler::~GpuSampler() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

GpuReading GpuSampler::latest() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

void GpuSampler::loop() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
    lock.unlock();
    GpuReading r = nvml_->read(index_);  // the driver call without the lock: latest() never waits on it
    lock.lock();
    latest_ = std::move(r);
  }
}

}  // namespace tessera::metrics
