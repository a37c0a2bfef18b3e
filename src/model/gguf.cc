#include "model/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>

#include "core/error.h"
#include "kernels/quant_types.h"

namespace kvcache {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kMaxStringBytes = uint64_t{1} << 30;
// Reserve no more entries up front than this: a declared count only bounds what the file could
// hold, and an entry in memory is up to 15x its smallest encoding (a 13-byte metadata pair
// becomes a 192-byte std::pair<std::string, GgufValue>); past it the vectors grow as entries
// are actually read.
constexpr uint64_t kMaxReserve = 4096;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

// Bounds-checked little-endian cursor over the mapping (the build targets x86-64, so a memcpy
// of the bytes is the little-endian value).
class Reader {
 public:
  explicit Reader(const MappedFile& f) : f_(f) {}
  uint64_t pos() const { return pos_; }
  template <typename T>
  T read(std::string_view what) {
    T v;
    std::memcpy(&v, f_.at(pos_, sizeof(T), what), sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(std::string_view what) {
    const auto n = read<uint64_t>(what);
    if (n > kMaxStringBytes)
      fail(f_.path(), std::string(what) + " has an implausible length " + std::to_string(n));
    const std::byte* p = f_.at(pos_, n, what);
    pos_ += n;
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  // Fails early when `count` elements of at least `min_bytes` each cannot fit, so a corrupt count
  // never triggers a huge allocation.
  void require(uint64_t count, uint64_t min_bytes, std::string_view what) const {
    const uint64_t left = f_.size() - pos_;
    if (min_bytes != 0 && count > left / min_bytes) {
      fail(f_.path(), "truncated: " + std::string(what) + " declares " + std::to_string(count) +
                          " elements but only " + std::to_string(left) + " bytes remain");
    }
  }

 private:
  const MappedFile& f_;
  uint64_t pos_ = 0;
};

uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
      return 8;  // at least the length
    case GgufType::kArray:
      return 12;  // at least type + count
  }
  return 0;
}

bool valid_type(uint32_t t) {
  return t <= 12;
}

bool is_int_type(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kBool:
      return true;
    default:
      return false;
  }
}
bool is_unsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}

// Reads one scalar of integer/bool type into (i, u).
void read_int(Reader& r, GgufType t, int64_t& i, uint64_t& u, std::string_view what) {
  switch (t) {
    case GgufType::kUint8:
      u = r.read<uint8_t>(what);
      i = static_cast<int64_t>(u);
      return;
    case GgufType::kInt8:
      i = r.read<int8_t>(what);
      u = static_cast<uint64_t>(i);
      return;
    case GgufType::kUint16:
      u = r.read<uint16_t>(what);
      i = static_cast<int64_t>(u);
      return;
    case GgufType::kInt16:
      i = r.read<int16_t>(what);
      u = static_cast<uint64_t>(i);
      return;
    case GgufType::kUint32:
      u = r.read<uint32_t>(what);
      i = static_cast<int64_t>(u);
      return;
    case GgufType::kInt32:
      i = r.read<int32_t>(what);
      u = static_cast<uint64_t>(i);
      return;
    case GgufType::kUint64:
      u = r.read<uint64_t>(what);
      i = static_cast<int64_t>(u);
      return;
    case GgufType::kInt64:
      i = r.read<int64_t>(what);
      u = static_cast<uint64_t>(i);
      return;
    case GgufType::kBool:
      u = r.read<uint8_t>(what);
      i = static_cast<int64_t>(u);
      return;
    default:
      break;
  }
  KV_CHECK(false, "read_int on a non-integer type");
}

GgufValue read_value(Reader& r, GgufType t, const std::string& path, const std::string& key,
                     int depth) {
  GgufValue v;
  v.type = t;
  const std::string what = "metadata '" + key + "'";
  if (is_int_type(t)) {
    read_int(r, t, v.i, v.u, what);
    if (t == GgufType::kBool && v.u > 1)
      fail(path, what + " is a bool with value " + std::to_string(v.u));
  } else if (t == GgufType::kFloat32) {
    v.f = r.read<float>(what);
  } else if (t == GgufType::kFloat64) {
    v.f = r.read<double>(what);
  } else if (t == GgufType::kString) {
    v.s = r.read_string(what);
  } else if (t == GgufType::kArray) {
    if (depth > 4) fail(path, what + " nests arrays too deeply");
    const auto et = r.read<uint32_t>(what);
    if (!valid_type(et))
      fail(path, what + " is an array of unknown value type " + std::to_string(et));
    v.array_type = static_cast<GgufType>(et);
    const auto n = r.read<uint64_t>(what);
    r.require(n, scalar_size(v.array_type), what);
    if (is_int_type(v.array_type)) {
      v.ints.resize(n);
      uint64_t u = 0;
      for (auto& x : v.ints) read_int(r, v.array_type, x, u, what);
    } else if (v.array_type == GgufType::kFloat32) {
      v.floats.resize(n);
      for (auto& x : v.floats) x = r.read<float>(what);
    } else if (v.array_type == GgufType::kFloat64) {
      v.floats.resize(n);
      for (auto& x : v.floats) x = r.read<double>(what);
    } else if (v.array_type == GgufType::kString) {
      v.strs.resize(n);
      for (auto& x : v.strs) x = r.read_string(what);
    } else {
      v.items.reserve(std::min(n, kMaxReserve));
      for (uint64_t k = 0; k < n; ++k) {
        v.items.push_back(read_value(r, GgufType::kArray, path, key, depth + 1));
      }
    }
  } else {
    fail(path, what + " has unknown value type " + std::to_string(static_cast<uint32_t>(t)));
  }
  return v;
}

// The DType of a ggml type id, if kvcache has one (core/dtype.cc's table).
std::optional<DType> ggml_dtype(uint32_t t) {
  for (int i = 0; i < kDTypeCount; ++i)
    if (dtype_info(static_cast<DType>(i)).ggml_type == t) return static_cast<DType>(i);
  return std::nullopt;
}

// Bytes of a tensor of a known ggml type; 0 (unknown) for others. *ok false when its rows are
// not whole blocks, or the size overflows.
uint64_t tensor_bytes(uint32_t type, const std::vector<uint64_t>& ne, bool* ok) {
  *ok = true;
  uint64_t n = 1;
  for (uint64_t d : ne) {
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / 256 / d) {
      *ok = false;
      return 0;
    }
    n *= d;
  }
  const std::optional<DType> dt = ggml_dtype(type);
  if (!dt) return 0;
  const DTypeInfo& info = dtype_info(*dt);
  if (!ne.empty() && ne[0] % static_cast<uint64_t>(info.block_elems) != 0) {
    *ok = false;
    return 0;
  }
  return n / static_cast<uint64_t>(info.block_elems) * static_cast<uint64_t>(info.block_bytes);
}

DType ggml_to_dtype(uint32_t t) {
  const std::optional<DType> dt = ggml_dtype(t);
  KV_CHECK(dt.has_value(), "ggml_to_dtype: unknown ggml type");
  return *dt;
}

uint32_t dtype_to_ggml(DType t) {
  return dtype_info(t).ggml_type;
}

// A type whose tensors kvcache reads: the float types, q8_0, and the block types whose
// kernels exist (kernels/quant_types.h).
bool dtype_supported(DType t) {
  if (dtype_is_float(t) || t == DType::kQ8_0) return true;
  const QuantKernels* q = quant_kernels(t);
  return q != nullptr && q->dot != nullptr && q->dequantize != nullptr;
}

bool is_supported(uint32_t t) {
  const std::optional<DType> dt = ggml_dtype(t);
  return dt && dtype_supported(*dt);
}

std::string supported_type_names() {
  std::string names;
  for (int i = 0; i < kDTypeCount; ++i)
    if (dtype_supported(static_cast<DType>(i)))
      names += (names.empty() ? "" : ", ") + std::string(dtype_name(static_cast<DType>(i)));
  return names;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                 "int32",  "float32", "bool",   "string", "array",
                                 "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "unknown";
}

const char* ggml_type_name(uint32_t t) {
  // ggml.h's enum ggml_type; ids 4 and 5 (q4_2, q4_3) were removed upstream.
  static const char* kNames[] = {
      "f32",     "f16",    "q4_0",    "q4_1",  "type 4", "type 5", "q5_0",  "q5_1",
      "q8_0",    "q8_1",   "q2_K",    "q3_K",  "q4_K",   "q5_K",   "q6_K",  "q8_K",
      "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s",  "iq2_s", "iq4_xs",
      "i8",      "i16",    "i32",     "i64",   "f64",    "iq1_m",  "bf16"};
  return t < std::size(kNames) ? kNames[t] : "an unknown ggml type";
}

// ---- GgufValue ----
GgufValue GgufValue::u32(uint32_t v) {
  GgufValue x;
  x.type = GgufType::kUint32;
  x.u = v;
  x.i = v;
  return x;
}
GgufValue GgufValue::i32(int32_t v) {
  GgufValue x;
  x.type = GgufType::kInt32;
  x.i = v;
  x.u = static_cast<uint64_t>(v);
  return x;
}
GgufValue GgufValue::u64(uint64_t v) {
  GgufValue x;
  x.type = GgufType::kUint64;
  x.u = v;
  x.i = static_cast<int64_t>(v);
  return x;
}
GgufValue GgufValue::f32(float v) {
  GgufValue x;
  x.type = GgufType::kFloat32;
  x.f = v;
  return x;
}
GgufValue GgufValue::boolean(bool v) {
  GgufValue x;
  x.type = GgufType::kBool;
  x.i = v;
  x.u = v;
  return x;
}
GgufValue GgufValue::str(std::string v) {
  GgufValue x;
  x.type = GgufType::kString;
  x.s = std::move(v);
  return x;
}
GgufValue GgufValue::str_array(std::vector<std::string> v) {
  GgufValue x;
  x.type = GgufType::kArray;
  x.array_type = GgufType::kString;
  x.strs = std::move(v);
  return x;
}
GgufValue GgufValue::f32_array(std::vector<float> v) {
  GgufValue x;
  x.type = GgufType::kArray;
  x.array_type = GgufType::kFloat32;
  x.floats.assign(v.begin(), v.end());
  return x;
}
GgufValue GgufValue::i32_array(std::vector<int32_t> v) {
  GgufValue x;
  x.type = GgufType::kArray;
  x.array_type = GgufType::kInt32;
  x.ints.assign(v.begin(), v.end());
  return x;
}
bool GgufValue::is_integer() const {
  return is_int_type(type);
}
bool GgufValue::is_float() const {
  return type == GgufType::kFloat32 || type == GgufType::kFloat64;
}
uint64_t GgufValue::array_size() const {
  return ints.size() + floats.size() + strs.size() + items.size();
}

// ---- GgufFile ----
std::shared_ptr<const GgufFile> GgufFile::open(const std::string& path, MapMode mode) {
  return open(MappedFile(path, mode));
}

std::shared_ptr<const GgufFile> GgufFile::open(MappedFile file) {
  std::shared_ptr<GgufFile> f(new GgufFile(std::move(file)));
  f->parse();
  return f;
}

void GgufFile::parse() {
  const std::string& path = file_.path();
  Reader r(file_);
  if (file_.size() < 4)
    fail(path,
         "not a GGUF file: " + std::to_string(file_.size()) + " bytes, too short for the magic");
  const auto magic = r.read<uint32_t>("the magic");
  if (magic != kGgufMagic) {
    std::string got(reinterpret_cast<const char*>(file_.data()), 4);
    for (char& c : got)
      if (static_cast<unsigned char>(c) < 32 || static_cast<unsigned char>(c) > 126) c = '?';
    fail(path, "not a GGUF file: magic is \"" + got + "\", expected \"GGUF\"");
  }
  version_ = r.read<uint32_t>("the version");
  if (version_ != 2 && version_ != 3) {
    fail(path, "unsupported GGUF version " + std::to_string(version_) +
                   (version_ > 0xffff ? " (a big-endian file?)" : "") +
                   ": this reader handles versions 2 and 3 (little-endian); re-convert the model "
                   "with a current llama.cpp");
  }
  const auto n_tensors = r.read<uint64_t>("the tensor count");
  const auto n_kv = r.read<uint64_t>("the metadata count");
  r.require(n_kv, 8 + 4 + 1, "the metadata");
  kv_.reserve(std::min(n_kv, kMaxReserve));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.read_string("a metadata key");
    const auto t = r.read<uint32_t>("metadata type");
    if (!valid_type(t))
      fail(path, "metadata '" + key + "' has unknown value type " + std::to_string(t));
    GgufValue v = read_value(r, static_cast<GgufType>(t), path, key, 0);
    if (kv_index_.count(key)) fail(path, "metadata key '" + key + "' appears twice");
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20)) {
      fail(path, "general.alignment must be a power of two, got " + std::to_string(a->i));
    }
    alignment_ = static_cast<uint32_t>(a->u);
  }
  r.require(n_tensors, 8 + 4 + 4 + 8, "the tensor infos");
  tensors_.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo info;
    info.name = r.read_string("a tensor name");
    const std::string what = "tensor '" + info.name + "'";
    const auto n_dims = r.read<uint32_t>(what);
    if (n_dims > 4)
      fail(path, what + " has " + std::to_string(n_dims) + " dims; GGUF allows at most 4");
    info.ne.resize(n_dims);
    for (auto& d : info.ne) {
      d = r.read<uint64_t>(what);
      if (d > (uint64_t{1} << 40))
        fail(path, what + " has an implausible dimension " + std::to_string(d));
    }
    info.ggml_type = r.read<uint32_t>(what);
    info.offset = r.read<uint64_t>(what);
    if (tensor_index_.count(info.name)) fail(path, what + " appears twice");
    bool ok = true;
    info.size_bytes = tensor_bytes(info.ggml_type, info.ne, &ok);
    if (!ok) {
      fail(path, what + " of type " + ggml_type_name(info.ggml_type) +
                     " has a shape that does not fit the type (its rows must be whole blocks: 32 "
                     "elements for q8_0 and q4_0..iq4_nl, 256 for the k-quants)");
    }
    if (info.offset % alignment_ != 0) {
      fail(path, what + " data offset " + std::to_string(info.offset) +
                     " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }
  data_offset_ = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  // Every tensor of a known size must lie inside the file. (Unknown types are refused later,
  // when a view is asked for, so that metadata of such files stays readable.)
  for (const GgufTensorInfo& t : tensors_) {
    if (!is_supported(t.ggml_type)) continue;
    const uint64_t size = file_.size();
    if (data_offset_ > size || t.offset > size - data_offset_ ||
        t.size_bytes > size - data_offset_ - t.offset) {
      fail(path, "tensor '" + t.name + "' data [" + std::to_string(data_offset_ + t.offset) + ", " +
                     std::to_string(data_offset_ + t.offset + t.size_bytes) +
                     ") lies outside the file of " + std::to_string(size) + " bytes (truncated?)");
    }
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {
[[noreturn]] void missing(const std::string& path, std::string_view key) {
  fail(path, "metadata '" + std::string(key) + "' is missing");
}
[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const GgufValue& v,
                             const char* expected) {
  fail(path, "metadata '" + std::string(key) + "' has type " + gguf_type_name(v.type) +
                 ", expected " + expected);
}
}  // namespace

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path(), key);
  if (!v->is_integer()) wrong_type(path(), key, *v, "an integer");
  if (is_unsigned(v->type) && v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail(path(), "metadata '" + std::string(key) + "' is too large");
  }
  return v->i;
}
int64_t GgufFile::get_int_or(std::string_view key, int64_t fallback) const {
  return find(key) ? get_int(key) : fallback;
}
double GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path(), key);
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  wrong_type(path(), key, *v, "a float");
}
double GgufFile::get_float_or(std::string_view key, double fallback) const {
  return find(key) ? get_float(key) : fallback;
}
bool GgufFile::get_bool_or(std::string_view key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_integer()) wrong_type(path(), key, *v, "a bool");
  return v->i != 0;
}
const std::string& GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path(), key);
  if (v->type != GgufType::kString) wrong_type(path(), key, *v, "a string");
  return v->s;
}
std::string GgufFile::get_string_or(std::string_view key, const std::string& fallback) const {
  return find(key) ? get_string(key) : fallback;
}
const GgufValue& GgufFile::get_array(std::string_view key, GgufType elem) const {
  const GgufValue* v = find(key);
  if (!v) missing(path(), key);
  const bool elem_ok =
      v->array_type == elem || (is_int_type(elem) && is_int_type(v->array_type)) ||
      ((elem == GgufType::kFloat32 || elem == GgufType::kFloat64) &&
       (v->array_type == GgufType::kFloat32 || v->array_type == GgufType::kFloat64));
  if (v->type != GgufType::kArray || !elem_ok) {
    fail(path(),
         "metadata '" + std::string(key) + "' should be an array of " + gguf_type_name(elem));
  }
  return *v;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

TensorView GgufFile::tensor_view(const GgufTensorInfo& info) const {
  if (!is_supported(info.ggml_type)) {
    throw Error(ErrorKind::kUnsupported, path() + ": tensor '" + info.name + "' has type " +
                                             ggml_type_name(info.ggml_type) +
                                             "; supported: " + supported_type_names() +
                                             " (re-quantize the model, e.g. llama-quantize ... "
                                             "Q4_K_M)");
  }
  Shape shape;
  shape.ndim = info.ne.empty() ? 1 : static_cast<int>(info.ne.size());
  for (int d = 0; d < static_cast<int>(info.ne.size()); ++d) {
    shape.dims[static_cast<size_t>(d)] =
        static_cast<int64_t>(info.ne[info.ne.size() - 1 - static_cast<size_t>(d)]);
  }
  // Views are typed non-const; the mapping is PROT_READ, so weights are read-only in fact.
  auto* p = const_cast<std::byte*>(file_.data() + data_offset_ + info.offset);
  return TensorView(p, ggml_to_dtype(info.ggml_type), shape);
}

// ---- writer ----
GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  KV_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
           "GGUF alignment must be a power of two");
  if (alignment != 32) set("general.alignment", GgufValue::u32(alignment));
}

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(const std::string& name, const TensorView& view) {
  if (!view.is_contiguous())
    throw Error(ErrorKind::kInvalidArgument, "GGUF tensor '" + name + "' must be contiguous");
  for (const auto& t : tensors_) {
    if (t.first == name)
      throw Error(ErrorKind::kInvalidArgument, "GGUF tensor '" + name + "' added twice");
  }
  tensors_.emplace_back(name, view);
}

namespace {
class Out {
 public:
  void raw(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  template <typename T>
  void put(T v) {
    raw(&v, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    raw(s.data(), s.size());
  }
  void pad(uint64_t alignment) {
    buf_.resize((buf_.size() + alignment - 1) / alignment * alignment, '\0');
  }
  std::string& buf() { return buf_; }

 private:
  std::string buf_;
};

void put_int(Out& o, GgufType t, int64_t i, uint64_t u) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kBool:
      o.put<uint8_t>(static_cast<uint8_t>(u));
      break;
    case GgufType::kInt8:
      o.put<int8_t>(static_cast<int8_t>(i));
      break;
    case GgufType::kUint16:
      o.put<uint16_t>(static_cast<uint16_t>(u));
      break;
    case GgufType::kInt16:
      o.put<int16_t>(static_cast<int16_t>(i));
      break;
    case GgufType::kUint32:
      o.put<uint32_t>(static_cast<uint32_t>(u));
      break;
    case GgufType::kInt32:
      o.put<int32_t>(static_cast<int32_t>(i));
      break;
    case GgufType::kUint64:
      o.put<uint64_t>(u);
      break;
    case GgufType::kInt64:
      o.put<int64_t>(i);
      break;
    default:
      KV_CHECK(false, "put_int on a non-integer type");
  }
}

void put_value(Out& o, const GgufValue& v) {
  if (is_int_type(v.type)) {
    put_int(o, v.type, v.i, v.u);
  } else if (v.type == GgufType::kFloat32) {
    o.put<float>(static_cast<float>(v.f));
  } else if (v.type == GgufType::kFloat64) {
    o.put<double>(v.f);
  } else if (v.type == GgufType::kString) {
    o.str(v.s);
  } else {
    o.put<uint32_t>(static_cast<uint32_t>(v.array_type));
    o.put<uint64_t>(v.array_size());
    if (is_int_type(v.array_type)) {
      for (int64_t x : v.ints) put_int(o, v.array_type, x, static_cast<uint64_t>(x));
    } else if (v.array_type == GgufType::kFloat32) {
      for (double x : v.floats) o.put<float>(static_cast<float>(x));
    } else if (v.array_type == GgufType::kFloat64) {
      for (double x : v.floats) o.put<double>(x);
    } else if (v.array_type == GgufType::kString) {
      for (const auto& s : v.strs) o.str(s);
    } else {
      for (const auto& item : v.items) put_value(o, item);
    }
  }
}
}  // namespace

void GgufWriter::write(const std::string& path) const {
  Out o;
  o.put<uint32_t>(kGgufMagic);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  for (const auto& [key, v] : kv_) {
    o.str(key);
    o.put<uint32_t>(static_cast<uint32_t>(v.type));
    put_value(o, v);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const auto& [name, view] : tensors_) {
    o.str(name);
    const int nd = view.ndim();
    o.put<uint32_t>(static_cast<uint32_t>(nd));
    for (int d = nd - 1; d >= 0; --d) o.put<uint64_t>(static_cast<uint64_t>(view.dim(d)));
    o.put<uint32_t>(dtype_to_ggml(view.dtype()));
    o.put<uint64_t>(offset);
    offsets.push_back(offset);
    offset += (dtype_bytes(view.dtype(), view.numel()) + alignment_ - 1) / alignment_ * alignment_;
  }
  o.pad(alignment_);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(ErrorKind::kIo, path + ": cannot open for writing");
  f.write(o.buf().data(), static_cast<std::streamsize>(o.buf().size()));
  static const char kZeros[64] = {};
  for (const auto& [name, view] : tensors_) {
    const size_t n = dtype_bytes(view.dtype(), view.numel());
    f.write(static_cast<const char*>(view.data()), static_cast<std::streamsize>(n));
    const size_t padded = (n + alignment_ - 1) / alignment_ * alignment_;
    for (size_t left = padded - n; left > 0;) {
      const size_t k = std::min(left, sizeof(kZeros));
      f.write(kZeros, static_cast<std::streamsize>(k));
      left -= k;
    }
  }
  f.flush();
  if (!f) throw Error(ErrorKind::kIo, path + ": write failed (disk full?)");
}

}  // namespace kvcache
