#include "cache/kv_policy.h"

#include <charconv>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace kvcache {

namespace {

// Far past any context; bounds the parameters so that their sums cannot overflow.
constexpr int64_t kMaxTokens = int64_t{1} << 40;

constexpr const char* kSpecs =
    "exact, streaming:sink=S,window=W, h2o:heavy=H,recent=R or "
    "snapkv:budget=B,window=w,kernel=k";

// Concatenation without operator+ chains (GCC 12 reports a false -Wrestrict in them).
std::string cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view p : parts) s.append(p);
  return s;
}

[[noreturn]] void bad_spec(std::string_view spec, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument,
              cat({"--kv-policy '", spec, "': ", what, "; expected ", kSpecs}));
}

// The parameter names of a kind, each with the field it sets.
std::vector<std::pair<const char*, int64_t*>> fields(KVPolicy& p) {
  switch (p.kind) {
    case KVPolicyKind::kExact:
      return {};
    case KVPolicyKind::kStreaming:
      return {{"sink", &p.sink}, {"window", &p.window}};
    case KVPolicyKind::kH2O:
      return {{"heavy", &p.heavy}, {"recent", &p.recent}};
    case KVPolicyKind::kSnapKV:
      return {{"budget", &p.budget}, {"window", &p.obs_window}, {"kernel", &p.kernel}};
  }
  return {};
}

}  // namespace

std::string_view KVPolicy::kind_name() const {
  switch (kind) {
    case KVPolicyKind::kExact:
      return "exact";
    case KVPolicyKind::kStreaming:
      return "streaming";
    case KVPolicyKind::kH2O:
      return "h2o";
    case KVPolicyKind::kSnapKV:
      return "snapkv";
  }
  return "unknown";
}

KVPolicy KVPolicy::parse(std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  KVPolicy p;
  if (kind == "exact") {
    p.kind = KVPolicyKind::kExact;
  } else if (kind == "streaming") {
    p.kind = KVPolicyKind::kStreaming;
  } else if (kind == "h2o") {
    p.kind = KVPolicyKind::kH2O;
  } else if (kind == "snapkv") {
    p.kind = KVPolicyKind::kSnapKV;
  } else {
    bad_spec(spec, cat({"unknown policy '", kind, "'"}));
  }
  if (colon == std::string_view::npos) {
    p.validate();
    return p;
  }
  std::string_view rest = spec.substr(colon + 1);
  if (p.kind == KVPolicyKind::kExact) bad_spec(spec, "exact takes no parameters");
  auto names = fields(p);
  std::vector<bool> seen(names.size(), false);
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) bad_spec(spec, cat({"'", item, "' is not NAME=VALUE"}));
    const std::string_view name = item.substr(0, eq), value = item.substr(eq + 1);
    size_t i = 0;
    while (i < names.size() && name != names[i].first) ++i;
    if (i == names.size()) {
      std::string known;
      for (const auto& [n, _] : names) known.append(known.empty() ? "" : ", ").append(n);
      bad_spec(spec, cat({p.kind_name(), " has no parameter '", name, "' (its parameters: ", known,
                          ")"}));
    }
    if (seen[i]) bad_spec(spec, cat({"'", name, "' is given twice"}));
    seen[i] = true;
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty())
      bad_spec(spec, cat({"'", name, "=", value, "': the value must be a whole number of tokens"}));
    *names[i].second = v;
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  p.validate();
  return p;
}

std::string KVPolicy::key() const {
  KVPolicy copy = *this;
  std::string s(kind_name());
  char sep = ':';
  for (const auto& [name, value] : fields(copy)) {
    s += sep + std::string(name) + "=" + std::to_string(*value);
    sep = ',';
  }
  return s;
}

void KVPolicy::validate() const {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, "--kv-policy " + key() + ": " + what);
  };
  KVPolicy copy = *this;
  for (const auto& [name, value] : fields(copy))
    if (*value > kMaxTokens)
      fail(std::string(name) + " must be at most " + std::to_string(kMaxTokens) + " tokens, got " +
           std::to_string(*value));
  switch (kind) {
    case KVPolicyKind::kExact:
      return;
    case KVPolicyKind::kStreaming:
      if (sink < 0) fail("sink must be >= 0 tokens, got " + std::to_string(sink));
      if (window < 1)
        fail("window must be >= 1 (the newest token must see itself), got " +
             std::to_string(window));
      return;
    case KVPolicyKind::kH2O:
      if (heavy < 0) fail("heavy must be >= 0 tokens, got " + std::to_string(heavy));
      if (recent < 0) fail("recent must be >= 0 tokens, got " + std::to_string(recent));
      if (heavy + recent < 1) fail("heavy + recent must keep at least one token");
      return;
    case KVPolicyKind::kSnapKV:
      if (obs_window < 1) fail("window must be >= 1 query, got " + std::to_string(obs_window));
      if (budget <= obs_window)
        fail("budget (" + std::to_string(budget) + ") must exceed the observation window (" +
             std::to_string(obs_window) + "): the window's own tokens are part of the budget");
      if (kernel < 1 || kernel % 2 == 0)
        fail("kernel must be an odd width >= 1 (a centred pooling), got " + std::to_string(kernel));
      return;
  }
}

}  // namespace kvcache
