// GGUF parsing with bounds checks on every read; see gguf.h.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace qevict {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxStringLen = 1ull << 30;
constexpr uint64_t kMaxArrayLen = 1ull << 28;
constexpr int kMaxDims = 4;

// Sequential reader over the mapped bytes; every read checks the remaining size.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  size_t pos() const { return pos_; }
  template <typename T>
  bool read(T* out) {
    if (n_ - pos_ < sizeof(T)) return false;
    std::memcpy(out, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool read_string(std::string* out) {
    uint64_t len;
    if (!read(&len)) return false;
    if (len > kMaxStringLen || n_ - pos_ < len) return false;
    out->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return true;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

bool read_scalar(Cursor& c, GgufValueType t, GgufValue* v) {
  v->type = t;
  switch (t) {
    case GgufValueType::kUint8: {
      uint8_t x;
      if (!c.read(&x)) return false;
      v->u = x;
      v->i = x;
      v->f = x;
      return true;
    }
    case GgufValueType::kInt8: {
      int8_t x;
      if (!c.read(&x)) return false;
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      v->f = x;
      return true;
    }
    case GgufValueType::kUint16: {
      uint16_t x;
      if (!c.read(&x)) return false;
      v->u = x;
      v->i = x;
      v->f = x;
      return true;
    }
    case GgufValueType::kInt16: {
      int16_t x;
      if (!c.read(&x)) return false;
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      v->f = x;
      return true;
    }
    case GgufValueType::kUint32: {
      uint32_t x;
      if (!c.read(&x)) return false;
      v->u = x;
      v->i = x;
      v->f = x;
      return true;
    }
    case GgufValueType::kInt32: {
      int32_t x;
      if (!c.read(&x)) return false;
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      v->f = x;
      return true;
    }
    case GgufValueType::kUint64: {
      uint64_t x;
      if (!c.read(&x)) return false;
      v->u = x;
      v->i = static_cast<int64_t>(x);
      v->f = static_cast<double>(x);
      return true;
    }
    case GgufValueType::kInt64: {
      int64_t x;
      if (!c.read(&x)) return false;
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      v->f = static_cast<double>(x);
      return true;
    }
    case GgufValueType::kFloat32: {
      float x;
      if (!c.read(&x)) return false;
      v->f = x;
      return true;
    }
    case GgufValueType::kFloat64: {
      double x;
      if (!c.read(&x)) return false;
      v->f = x;
      return true;
    }
    case GgufValueType::kBool: {
      uint8_t x;
      if (!c.read(&x)) return false;
      v->u = x != 0;
      v->i = x != 0;
      return true;
    }
    case GgufValueType::kString:
      return c.read_string(&v->s);
    case GgufValueType::kArray:
      return false;  // handled by the caller
  }
  return false;
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kBool:
      return true;
    default:
      return false;
  }
}

double GgufValue::as_double() const {
  if (type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64) return f;
  if (type == GgufValueType::kUint64) return static_cast<double>(u);
  return static_cast<double>(i);
}

const char* gguf_value_type_name(GgufValueType t) {
  static const char* kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                 "int32",  "float32", "bool",   "string", "array",
                                 "uint64", "int64",   "float64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "unknown";
}

Expected<std::shared_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Status::error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(fmt::format("{}: not a regular file", path));
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size < 24) {
    ::close(fd);
    return Status::error(fmt::format("{}: file too small to be GGUF ({} bytes)", path, size));
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED)
    return Status::error(fmt::format("{}: mmap failed: {}", path, std::strerror(errno)));
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->mapped_ = true;
  Status s = f->parse();
  if (!s) return s;
  return f;
}

Expected<std::shared_ptr<GgufFile>> GgufFile::from_memory(const uint8_t* data, size_t size,
                                                          const std::string& name) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->base_ = data;
  f->size_ = size;
  Status s = f->parse();
  if (!s) return s;
  return f;
}

GgufFile::~GgufFile() {
  if (mapped_ && base_) munmap(const_cast<uint8_t*>(base_), size_);
}

Status GgufFile::parse() {
  auto err = [&](const std::string& what) {
    return Status::error(fmt::format("{}: {}", path_, what));
  };
  Cursor c(base_, size_);
  uint32_t magic;
  if (!c.read(&magic) || magic != kMagic) return err("not a GGUF file (bad magic)");
  if (!c.read(&version_)) return err("truncated header");
  if (version_ != 2 && version_ != 3)
    return err(fmt::format("unsupported GGUF version {} (supported: 2, 3)", version_));
  uint64_t n_tensors, n_kv;
  if (!c.read(&n_tensors) || !c.read(&n_kv)) return err("truncated header");
  // Each kv needs at least 12 bytes and each tensor info at least 24: reject absurd counts early.
  if (n_kv > size_ / 12 || n_tensors > size_ / 24) return err("header counts exceed the file size");

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    if (!c.read_string(&key)) return err(fmt::format("truncated metadata key #{}", k));
    uint32_t t;
    if (!c.read(&t)) return err(fmt::format("truncated metadata '{}'", key));
    if (!valid_value_type(t))
      return err(fmt::format("metadata '{}' has unknown value type {}", key, t));
    GgufValue v;
    v.type = static_cast<GgufValueType>(t);
    if (v.type == GgufValueType::kArray) {
      uint32_t et;
      uint64_t n;
      if (!c.read(&et) || !c.read(&n)) return err(fmt::format("truncated array '{}'", key));
      if (!valid_value_type(et) || et == static_cast<uint32_t>(GgufValueType::kArray))
        return err(fmt::format("array '{}' has unsupported element type {}", key, et));
      if (n > kMaxArrayLen || n > size_ - c.pos())
        return err(fmt::format("array '{}' length {} exceeds the file", key, n));
      v.arr_type = static_cast<GgufValueType>(et);
      v.arr.resize(n);
      for (uint64_t j = 0; j < n; ++j)
        if (!read_scalar(c, v.arr_type, &v.arr[j]))
          return err(fmt::format("truncated array '{}'", key));
    } else if (!read_scalar(c, v.type, &v)) {
      return err(fmt::format("truncated metadata '{}'", key));
    }
    if (kv_.count(key)) return err(fmt::format("duplicate metadata key '{}'", key));
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > 65536)
      return err("general.alignment must be a power of two");
    alignment_ = static_cast<uint32_t>(a->u);
  }

  tensors_.resize(n_tensors);
  for (uint64_t ti = 0; ti < n_tensors; ++ti) {
    GgufTensorInfo& info = tensors_[ti];
    if (!c.read_string(&info.name)) return err(fmt::format("truncated tensor info #{}", ti));
    uint32_t n_dims;
    if (!c.read(&n_dims)) return err(fmt::format("truncated tensor info '{}'", info.name));
    if (n_dims == 0 || n_dims > kMaxDims)
      return err(fmt::format("tensor '{}' has {} dims (1..4 allowed)", info.name, n_dims));
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      int64_t ne;
      if (!c.read(&ne)) return err(fmt::format("truncated tensor info '{}'", info.name));
      if (ne <= 0 || ne > (int64_t(1) << 40) || n > std::numeric_limits<int64_t>::max() / ne)
        return err(fmt::format("tensor '{}' has an invalid dimension {}", info.name, ne));
      n *= ne;
      info.dims.push_back(ne);
    }
    uint32_t type;
    if (!c.read(&type) || !c.read(&info.offset))
      return err(fmt::format("truncated tensor info '{}'", info.name));
    const GgmlTypeInfo* ti_info = ggml_type_info(type);
    if (!ti_info) return err(fmt::format("tensor '{}' has unknown type id {}", info.name, type));
    info.type = static_cast<GgmlType>(type);
    if (info.dims[0] % ti_info->block_elems != 0)
      return err(fmt::format("tensor '{}': row length {} is not a multiple of the {} block size {}",
                             info.name, info.dims[0], ti_info->name, ti_info->block_elems));
    info.n_elements = n;
    // Bound the block count by the file size first: n * block_bytes can wrap uint64 (2^62 f32
    // elements would give 0 bytes and pass the bounds check below).
    const uint64_t n_blocks = static_cast<uint64_t>(n / ti_info->block_elems);
    if (n_blocks > size_ / static_cast<uint64_t>(ti_info->block_bytes))
      return err(fmt::format("tensor '{}' ({} elements of {}) is larger than the file", info.name,
                             n, ti_info->name));
    info.n_bytes = n_blocks * static_cast<uint64_t>(ti_info->block_bytes);
    if (tensor_index_.count(info.name)) return err(fmt::format("duplicate tensor '{}'", info.name));
    tensor_index_[info.name] = ti;
  }

  size_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > size_ && n_tensors > 0) return err("truncated: no tensor data section");
  for (auto& info : tensors_) {
    if (info.offset % alignment_ != 0)
      return err(fmt::format("tensor '{}' offset {} is not aligned to {}", info.name, info.offset,
                             alignment_));
    if (data_start > size_ || info.offset > size_ - data_start ||
        info.n_bytes > size_ - data_start - info.offset)
      return err(
          fmt::format("tensor '{}' (offset {}, {} bytes) lies outside the file ({} bytes): "
                      "truncated or corrupt",
                      info.name, info.offset, info.n_bytes, size_));
    info.data = base_ + data_start + info.offset;
  }
  return Status::ok();
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Expected<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("{}: missing metadata '{}'", path_, key));
  if (v->type != GgufValueType::kString)
    return Status::error(fmt::format("{}: metadata '{}' is not a string", path_, key));
  return v->s;
}

Expected<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("{}: missing metadata '{}'", path_, key));
  if (!v->is_integer())
    return Status::error(fmt::format("{}: metadata '{}' is not an integer", path_, key));
  return v->i;
}

Expected<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("{}: missing metadata '{}'", path_, key));
  if (!v->is_number())
    return Status::error(fmt::format("{}: metadata '{}' is not a number", path_, key));
  return v->as_double();
}

int64_t GgufFile::get_int_or(const std::string& key, int64_t dflt) const {
  const GgufValue* v = find(key);
  return v && v->is_integer() ? v->i : dflt;
}

double GgufFile::get_float_or(const std::string& key, double dflt) const {
  const GgufValue* v = find(key);
  return v && v->is_number() ? v->as_double() : dflt;
}

std::string GgufFile::get_string_or(const std::string& key, const std::string& dflt) const {
  const GgufValue* v = find(key);
  return v && v->type == GgufValueType::kString ? v->s : dflt;
}

}  // namespace qevict
