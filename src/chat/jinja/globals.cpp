// The functions every template can call: Jinja2's defaults (range, dict, namespace,
// joiner) and the two Hugging Face adds (raise_exception, strftime_now).
#include <ctime>

#include "chat/jinja/builtins.h"

namespace kiln::jinja {
namespace {

// Jinja2's sandbox refuses longer ranges (MAX_RANGE), and so does kiln.
constexpr int64_t kMaxRange = 100000;

Value range(const CallArgs& args) {
  if (!args.keyword.empty()) throw TemplateError("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) throw TemplateError("range expected 1 to 3 arguments, got " + std::to_string(p.size()));
  for (const Value& v : p)
    if (!v.is_int() && !v.is_bool())
      throw TemplateError(std::string("'") + v.type_name() + "' object cannot be interpreted as an integer");
  const int64_t start = p.size() == 1 ? 0 : p[0].as_int();
  const int64_t stop = p.size() == 1 ? p[0].as_int() : p[1].as_int();
  const int64_t step = p.size() == 3 ? p[2].as_int() : 1;
  if (step == 0) throw TemplateError("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if ((int64_t)items.size() >= kMaxRange) throw TemplateError("range too big: at most 100000 items");
    items.emplace_back(i);
    if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
  }
  return Value::list(std::move(items));
}

// dict(mapping_or_pairs, **kwargs), also what namespace() starts from.
std::shared_ptr<Dict> dict_from(const CallArgs& args, const char* function) {
  if (args.positional.size() > 1)
    throw TemplateError(std::string(function) + "() expected at most 1 positional argument");
  auto d = std::make_shared<Dict>();
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.is_dict()) {
      d->entries = src.dict_ref().entries;
    } else {
      for (const Value& pair : iterate(src)) {
        const auto kv = iterate(pair);
        if (kv.size() != 2) throw TemplateError("dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        d->set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keyword) d->set(Value(k), v);
  return d;
}

Value joiner(const CallArgs& args) {
  Arguments a(args, "joiner", {"sep"});
  const std::string sep = a.has(0) ? a.get(0).to_string() : ", ";
  auto used = std::make_shared<bool>(false);
  return make_function("joiner", [sep, used](const CallArgs&) {
    if (!*used) {
      *used = true;
      return Value("");
    }
    return Value(sep);
  });
}

Value raise_exception(const CallArgs& args) {
  Arguments a(args, "raise_exception", {"message"});
  throw TemplateRaisedError(a.get(0).to_string());
}

Value strftime_now(const CallArgs& args) {
  Arguments a(args, "strftime_now", {"format"}, 1);
  const std::string format = a.get(0).to_string();
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::string buf(256 + format.size() * 16, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
  buf.resize(n);
  return Value(std::move(buf));
}

}  // namespace

std::vector<std::pair<std::string, Value>> global_functions() {
  return {
      {"range", make_function("range", range)},
      {"dict", make_function("dict", [](const CallArgs& args) { return Value(dict_from(args, "dict")); })},
      {"namespace", make_function("namespace",
                                  [](const CallArgs& args) {
                                    auto d = dict_from(args, "namespace");
                                    d->kind = Dict::Kind::namespace_object;
                                    return Value(std::move(d));
                                  })},
      {"joiner", make_function("joiner", joiner)},
      {"raise_exception", make_function("raise_exception", raise_exception)},
      {"strftime_now", make_function("strftime_now", strftime_now)},
  };
}

}  // namespace kiln::jinja
