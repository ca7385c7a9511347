// GpuBulkStore: private copies of an allocation for readers who may not
// write it (ExportCopy), and checksums summed on the device (Checksums).
#include <optional>
#include <vector>

#include "store/cuda_util.h"
#include "store/gpu_bulk_store.h"
#include "store/gpu_bulk_store_internal.h"
#include "store/sum64_kernel.h"
#include "util/log.h"
#include "util/step_trace.h"

namespace gpufs {

Result<IpcExport> GpuBulkStore::ExportCopy(BlobId id, BlobId copy, bool queued) {
  StepTrace trace("private copy");
  GPUFS_RETURN_IF_ERROR(PlaceEmpty(id));
  const std::string what = "gpu store " + device_.Name() + ": a private copy of " + Describe(id);
  std::byte* source = nullptr;
  uint64_t bytes = 0, offset = 0, size = 0, source_alloc = 0;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "copy");
    if (!rec->sealed) return Error(EBUSY, what + ": it is still being written");
    if (blobs_.contains(copy)) return Error(EEXIST, what + ": " + Describe(copy) + " is live");
    const Allocation* alloc = FindAllocLocked(rec->place.alloc);
    if (alloc == nullptr) return Error(EIO, what + ": its allocation is gone");
    source = alloc->base();
    source_alloc = alloc->id;
    bytes = alloc->bytes();
    offset = rec->place.offset;
    size = rec->size;
    if (bytes > RoomLocked(0)) return FullLocked(what, bytes);
    used_ += bytes;  // reserved now, so that concurrent calls cannot take it
  }
  // The whole allocation, byte for byte: the blob keeps its offset (and a
  // copy of a pack or group holds only blobs of the same callers).
  // Taken as a fill that ends when the copy goes: the pool makes the next
  // ready allocation of this size then (or at the next take), not now,
  // when zeroing it would halve the bandwidth of this copy (a 1 GiB copy
  // took 0.95 ms beside the refill on the H200, 0.51 alone) and its
  // export would slow the reader's import.
  auto alloc = std::make_unique<Allocation>();
  Status made = MakeMemory(alloc.get(), bytes, /*pooled=*/true, /*producer_fills=*/true,
                           /*zero=*/false);  // the copy overwrites every byte
  trace.Step("memory");
  // Queued only into zeroed memory: whoever maps it before the copy ends
  // sees zeros or the blob's bytes, nothing of an earlier allocation's.
  std::shared_ptr<CudaEvent> done;
  std::optional<CopySignals::Slot> signal;
  if (made.ok() && queued && alloc->zeroed) {
    made = QueueDeviceToDevice(alloc->base(), source, bytes, &done, &signal);
  } else if (made.ok()) {
    made = DeviceToDevice(alloc->base(), source, bytes);
  }
  trace.Step(done ? "d2d queued" : "d2d");
  {
    std::lock_guard lock(mu_);
    if (!made.ok()) {
      used_ -= bytes;
      EndFillLocked(alloc.get());
      return made.Prepend(what);
    }
    alloc->id = next_alloc_id_++;
    alloc->blobs = 1;
    Place place{.alloc = alloc->id, .offset = 0, .reserved = bytes, .data = alloc->base()};
    blobs_.emplace(copy, BlobRecord{.place = place,
                                    .size = bytes,
                                    .owner = 0,
                                    .sealed = true,
                                    .key = SharingKey(),
                                    .retired = {}});
    allocs_.emplace(alloc->id, std::move(alloc));
    ++dedicated_count_;
    if (done) in_flight_.emplace(copy, CopyInFlight{.source = source_alloc, .done = done, .result = {}});
    if (signal) signal_slots_.emplace(copy, *signal);
  }
  auto out = Export(copy);  // kLegacy: its cudaIpc handle
  trace.Step("export");
  if (!out.ok()) {
    Free(copy);
    return out.status().Prepend(what);
  }
  out->offset = offset;
  out->size = size;
  out->copy_pending = done != nullptr;
  if (done && signal) {
    out->copy_signal = IpcExport::CopySignal{
        .fd = signals_->fd(), .offset = signal->offset, .value = signal->value};
  }
  return out;
}

Status GpuBulkStore::QueueDeviceToDevice(std::byte* dst, const std::byte* src, uint64_t bytes,
                                         std::shared_ptr<CudaEvent>* done,
                                         std::optional<CopySignals::Slot>* signal) const {
  StepTrace trace("queue d2d");
  GPUFS_RETURN_IF_ERROR(Enter());
  GPUFS_ASSIGN_OR_RETURN(cudaStream_t stream, gpu_bulk_store_internal::ThreadStream(ordinal_));
  trace.Step("stream");
  GPUFS_ASSIGN_OR_RETURN(CudaEvent event, CudaEvent::Create());
  trace.Step("event");
  Status queued = CudaError("cudaMemcpyAsync(DeviceToDevice)",
                            cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  trace.Step("memcpy");
  // The reader's signal, between the copy and `done`: a reader without one
  // asks GPUFS_IOC_COPY_WAIT instead.
  if (queued.ok() && signals_) {
    if (std::optional<CopySignals::Slot> slot = signals_->Take()) {
      if (Status written = signals_->Write(stream, *slot); written.ok()) {
        *signal = slot;
      } else {
        signals_->Release(*slot);
        GPUFS_LOG(DEBUG) << "gpu store " << device_ << ": no signal for a reader ("
                         << written.ToString() << "); it asks the daemon";
      }
    }
    trace.Step("signal");
  }
  if (queued.ok()) queued = CudaError("cudaEventRecord", cudaEventRecord(event.get(), stream));
  trace.Step("record");
  if (!queued.ok()) {
    // Whatever was queued ends before the memory can go.
    Status synced = CudaError("cudaStreamSynchronize", cudaStreamSynchronize(stream));
    (void)synced;
    if (*signal) signals_->Release(**signal);
    signal->reset();
    return queued;
  }
  *done = std::make_shared<CudaEvent>(std::move(event));
  return Status::Ok();
}

Status GpuBulkStore::AwaitCopy(BlobId copy) {
  std::lock_guard lock(mu_);
  return AwaitCopyLocked(copy);
}

Status GpuBulkStore::AwaitCopyLocked(BlobId copy) {
  auto it = in_flight_.find(copy);
  if (it == in_flight_.end()) return Status::Ok();
  CopyInFlight& flight = it->second;
  if (!flight.result) {
    Status synced = Enter();
    if (synced.ok()) {
      synced = CudaError("cudaEventSynchronize", cudaEventSynchronize(flight.done->get()));
    }
    flight.result = synced;
  }
  Status result = flight.result->ok()
                      ? Status::Ok()
                      : Error(EIO, "gpu store " + device_.Name() + ": the private copy " +
                                       Describe(copy) + " failed: " + flight.result->ToString());
  in_flight_.erase(it);
  return result;
}

void GpuBulkStore::AwaitCopiesFromLocked(uint64_t alloc) {
  for (auto& [copy, flight] : in_flight_) {
    if (flight.source != alloc || flight.result) continue;
    Status synced = Enter();
    if (synced.ok()) {
      synced = CudaError("cudaEventSynchronize", cudaEventSynchronize(flight.done->get()));
    }
    flight.result = synced;  // AwaitCopy reports it
  }
}

Result<std::vector<uint64_t>> GpuBulkStore::Checksums(std::span<const BlobId> ids,
                                                      std::span<const uint64_t> sizes) {
  if (ids.size() != sizes.size()) return Error(EINVAL, "checksums: ids and sizes differ in count");
  std::vector<DeviceRange> ranges(ids.size());
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < ids.size(); ++i) {
      BlobRecord* rec = FindLocked(ids[i]);
      if (rec == nullptr) return MissingLocked(ids[i], "checksum");
      if (sizes[i] > rec->size) {
        return Error(EINVAL, "gpu store " + device_.Name() + ": checksum of " + Describe(ids[i]) +
                                 " past its " + std::to_string(rec->size) + " bytes");
      }
      ranges[i] = {.data = rec->place.data, .bytes = sizes[i]};
    }
  }
  GPUFS_RETURN_IF_ERROR(Enter());
  GPUFS_ASSIGN_OR_RETURN(cudaStream_t stream, gpu_bulk_store_internal::ThreadStream(ordinal_));
  auto sums = DeviceSum64(ranges.data(), ranges.size(), stream);
  if (!sums.ok()) return sums.status().Prepend("gpu store " + device_.Name() + ": checksums");
  return sums;
}

}  // namespace gpufs
