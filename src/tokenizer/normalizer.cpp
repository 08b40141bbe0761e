#include "tokenizer/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "kiln/error.h"

namespace kiln {
namespace {

std::string unicode_form(const std::string& text, Normalizer::Form form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case Normalizer::Form::nfc: n = icu::Normalizer2::getNFCInstance(status); break;
    case Normalizer::Form::nfd: n = icu::Normalizer2::getNFDInstance(status); break;
    case Normalizer::Form::nfkc: n = icu::Normalizer2::getNFKCInstance(status); break;
    case Normalizer::Form::nfkd: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  if (U_FAILURE(status)) throw Error(std::string("ICU normalizer unavailable: ") + u_errorName(status));
  const icu::UnicodeString src = icu::UnicodeString::fromUTF8(text);
  // Most text is already normalized; the quick check skips the copy for it.
  if (n->isNormalized(src, status) && U_SUCCESS(status)) return text;
  status = U_ZERO_ERROR;
  const icu::UnicodeString dst = n->normalize(src, status);
  if (U_FAILURE(status)) throw Error(std::string("ICU normalization failed: ") + u_errorName(status));
  std::string out;
  dst.toUTF8String(out);
  return out;
}

std::string lowercase(const std::string& text) {
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(text);
  s.toLower();
  std::string out;
  s.toUTF8String(out);
  return out;
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(text, pos, hit - pos);
    out += to;
  }
  out.append(text, pos, std::string::npos);
  text.swap(out);
}

}  // namespace

void Normalizer::add_unicode_form(Form form) { steps_.push_back({Kind::form, form, {}, {}}); }
void Normalizer::add_replace(std::string from, std::string to) {
  steps_.push_back({Kind::replace, Form::nfc, std::move(from), std::move(to)});
}
void Normalizer::add_prepend(std::string prefix, bool unless_present) {
  steps_.push_back({Kind::prepend, Form::nfc, std::move(prefix), {}, unless_present});
}
void Normalizer::add_lowercase() { steps_.push_back({Kind::lowercase, Form::nfc, {}, {}}); }

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::form: s = unicode_form(s, step.form); break;
      case Kind::replace: replace_all(s, step.a, step.b); break;
      case Kind::prepend:
        if (!s.empty() && !(step.unless_present && s.compare(0, step.a.size(), step.a) == 0)) s.insert(0, step.a);
        break;
      case Kind::lowercase: s = lowercase(s); break;
    }
  }
  return s;
}

}  // namespace kiln
