#include "storage/readable_file.h"

#include "storage/s3_client.h"

namespace tessera::storage {
namespace {

class ObjectSlice : public ReadableFile {
 public:
  ObjectSlice(S3Client& client, ObjectUrl url, uint64_t offset, uint64_t size)
      : client_(client), url_(std::move(url)), offset_(offset), size_(size) {}
  uint64_t size() const override { return size_; }
  bool read_at(uint64_t offset, uint64_t n, void* out) const override {
    if (offset > size_ || n > size_ - offset) return false;
    client_.get_range(url_, offset_ + offset, n, out);
    return true;
  }

 private:
  S3Client& client_;
  ObjectUrl url_;
  uint64_t offset_, size_;
};

}  // namespace

std::unique_ptr<ReadableFile> object_slice(S3Client& client, ObjectUrl url, uint64_t offset, uint64_t size) {
  return std::make_unique<ObjectSlice>(client, std::move(url), offset, size);
}

}  // namespace tessera::storage
