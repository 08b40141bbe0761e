// Chat templates: kiln's Jinja2 interpreter against renderings made by Jinja2 itself
// (tests/data/templates/expected, see generate.py there), the language feature by feature,
// errors, truncated templates, and the `kiln template` command.
#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <random>

#include "kiln/chat_template.h"
#include "test_util.h"

using namespace kiln::test;
using kiln::ChatTemplate;
using Json = nlohmann::ordered_json;

namespace {

std::string data_dir() { return std::string(KILN_SOURCE_DIR) + "/tests/data/templates"; }

// A template's file: tests/data/templates/<name>.jinja, else ../shared/templates/<name>.jinja.
std::string template_path(const std::string& name) {
  const std::string local = data_dir() + "/" + name + ".jinja";
  return std::filesystem::exists(local) ? local : shared_path("templates/" + name + ".jinja");
}

const Json& conversations() {
  static const Json convs = Json::parse(read_file(data_dir() + "/expected/conversations.json"));
  return convs;
}

std::string render_conversation(const ChatTemplate& t, const std::string& conv) {
  const Json& c = conversations().at(conv);
  return t.render(c.at("messages"), c.at("add_generation_prompt").get<bool>(), "<BOS>", "<EOS>", c.at("context"));
}

// Renders `source` for one user message "Hi" (plus `context`), as the unit tests below do.
std::string R(const std::string& source, const Json& context = Json::object()) {
  const Json messages = Json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])");
  return ChatTemplate(source).render(messages, true, "<s>", "</s>", context);
}

// The message of the error `source` throws while parsing or rendering ("" if none).
std::string error_of(const std::string& source, const Json& context = Json::object()) {
  try {
    R(source, context);
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

struct Expected {
  std::string template_name, conversation, file;
  bool is_error = false;
};

void PrintTo(const Expected& e, std::ostream* os) { *os << e.template_name << " x " << e.conversation; }

std::vector<Expected> expected_files() {
  std::vector<Expected> out;
  for (const auto& entry : std::filesystem::directory_iterator(data_dir() + "/expected")) {
    const std::string file = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    if (ext != ".txt" && ext != ".error") continue;
    const std::string stem = entry.path().stem().string();
    const size_t dot = stem.rfind('.');
    out.push_back({stem.substr(0, dot), stem.substr(dot + 1), entry.path().string(), ext == ".error"});
  }
  std::sort(out.begin(), out.end(), [](const Expected& a, const Expected& b) { return a.file < b.file; });
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Expected>& info) {
  std::string name = info.param.template_name + "_" + info.param.conversation;
  for (char& c : name)
    if (!std::isalnum((unsigned char)c)) c = '_';
  return name;
}

}  // namespace

// ---- every template x conversation, byte for byte ----

class TemplateGolden : public ::testing::TestWithParam<Expected> {};

TEST_P(TemplateGolden, RendersLikeJinja2) {
  const Expected& e = GetParam();
  const ChatTemplate t(read_file(template_path(e.template_name)));
  const std::string want = read_file(e.file);
  if (!e.is_error) {
    EXPECT_EQ(render_conversation(t, e.conversation), want);
    return;
  }
  if (want.rfind("raise: ", 0) == 0) {  // the template's own raise_exception: the same message
    try {
      render_conversation(t, e.conversation);
      ADD_FAILURE() << "expected raise_exception: " << want;
    } catch (const kiln::TemplateRaisedError& err) {
      EXPECT_EQ(std::string(err.what()), want.substr(7));
    }
  } else {  // Jinja2 failed otherwise: kiln must fail too, with its own message
    EXPECT_THROW(render_conversation(t, e.conversation), kiln::TemplateError) << want;
  }
}

INSTANTIATE_TEST_SUITE_P(Jinja, TemplateGolden, ::testing::ValuesIn(expected_files()), param_name);

TEST(ChatTemplate, EveryRealTemplateHasItsExpectedRenderings) {
  // The ten templates of ../shared/templates, plus those generate.py extracted.
  for (const char* name : {"HuggingFaceTB-SmolLM3-3B", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "Qwen-Qwen2.5-7B-Instruct",
                           "Qwen-Qwen3-0.6B", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "google-gemma-2-2b-it",
                           "ibm-granite-granite-4.0", "meta-llama-Llama-3.1-8B-Instruct", "microsoft-Phi-3.5-mini-instruct",
                           "mistralai-Mistral-Nemo-Instruct-2407", "hf-llama3", "hf-qwen3", "hf-gemma3", "gguf-phi-3"}) {
    for (const char* conv : {"hello", "libai", "kvcache", "tools", "think"}) {
      const std::string stem = data_dir() + "/expected/" + name + "." + conv;
      EXPECT_TRUE(std::filesystem::exists(stem + ".txt") || std::filesystem::exists(stem + ".error")) << stem;
    }
  }
}

TEST(ChatTemplate, BuiltinsAreTheTestedSources) {
  const auto names = kiln::builtin_chat_template_names();
  EXPECT_EQ(names.size(), 7u);
  for (const std::string& name : names) {
    ASSERT_NE(kiln::builtin_chat_template(name), nullptr) << name;
    EXPECT_EQ(kiln::builtin_chat_template(name), read_file(data_dir() + "/builtin-" + name + ".jinja")) << name;
  }
  EXPECT_EQ(kiln::builtin_chat_template("nope"), nullptr);
}

TEST(ChatTemplate, ChatMessagesAndPlainJsonWork) {
  const ChatTemplate t(kiln::builtin_chat_template("chatml"));
  std::vector<kiln::ChatMessage> msgs = {{"user", "Hello!", Json::object()}};
  const std::string want = read_file(data_dir() + "/expected/builtin-chatml.hello.txt");
  EXPECT_EQ(t.render(msgs, true, "<BOS>", "<EOS>"), want);
  const nlohmann::json plain = nlohmann::json::parse(R"([{"role": "user", "content": "Hello!"}])");
  EXPECT_EQ(t.render(plain, true, "<BOS>", "<EOS>"), want);
  // Extra fields reach the template.
  msgs[0].extra = {{"name", "ann"}};
  EXPECT_EQ(ChatTemplate("{{ messages[0].name }}").render(msgs, false, "", ""), "ann");
}

TEST(ChatTemplate, StrftimeNowIsTheCurrentTime) {
  auto year_now = [] {
    char year[8];
    const std::time_t now = std::time(nullptr);
    std::strftime(year, sizeof year, "%Y", std::localtime(&now));
    return std::string(year);
  };
  const std::string before = year_now();
  const std::string got = R("{{ strftime_now('%Y') }}");
  EXPECT_TRUE(got == before || got == year_now()) << got;
  EXPECT_EQ(R("{{ strftime_now('%d %b %Y')|length }}"), "11");
}

TEST(ChatTemplate, ContextVariables) {
  const ChatTemplate t("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools[0].name }}|{{ messages|length }}");
  EXPECT_EQ(t.render(Json::array(), true, "B", "E", {{"tools", {{{"name", "f"}}}}}), "B|E|True|f|0");
  EXPECT_THROW(t.render(Json::array(), true, "B", "E", Json::array()), kiln::Error);
}

// ---- the language ----

struct Case {
  const char* source;
  const char* want;
};

void expect_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    try {
      EXPECT_EQ(R(c.source), c.want) << c.source;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.source << " threw " << e.what();
    }
  }
}

TEST(JinjaSyntax, LiteralsAndPythonStr) {
  expect_cases({
      {"{{ 'a\\tb' ~ \"c\\\"d\" ~ '\\x41\\u00e9\\101' }}", "a\tbc\"dAéA"},
      {"{{ 42 }} {{ -7 }} {{ 3.5 }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 0x1F }} {{ 1_000 }}",
       "42 -7 3.5 1000.0 0.30000000000000004 1e+20 1.5e-07 31 1000"},
      {"{{ true }} {{ False }} {{ none }} {{ None }}", "True False None None"},
      {"{{ [1, 'two', 3.0, none, true] }} {{ {'k': 'v', 'n': [1, (2, 3)]} }} {{ (1,) }} {{ () }}",
       "[1, 'two', 3.0, None, True] {'k': 'v', 'n': [1, (2, 3)]} (1,) ()"},
      {"{{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}", "[\"it's\", 'say \"hi\"', 'both \\' \"']"},
      {"{{ 'a' 'b' \"c\" }}", "abc"},
      {"{{ {'a': {'b': 1}} }}", "{'a': {'b': 1}}"},
      {"{{ 1, 2 }}", "(1, 2)"},
  });
}

TEST(JinjaSyntax, Operators) {
  expect_cases({
      {"{{ 7 + 2 }} {{ 7 - 2.5 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }}", "9 4.5 21 3.5 4.0 3 -4"},
      {"{{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ -7.5 // 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }}", "1 2 1.5 -4.0 1024 0.5 64"},
      {"{{ 'ab' * 3 }} {{ [0] * 3 }} {{ 'x' ~ 1 ~ none }} {{ 1 + true }} {{ [1] + [2] }} {{ (1,) + (2,) }}",
       "ababab [0, 0, 0] x1None 2 [1, 2] (1, 2)"},
      {"{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1, 2] < [1, 3] }} {{ 'B' < 'a' }} {{ 2 >= 2 }}",
       "True True True True True True"},
      {"{{ 'ell' in 'hello' }} {{ 3 not in [1, 2] }} {{ 'k' in {'k': 1} }} {{ not 1 in [1] }}", "True True True False"},
      {"{{ 0 or 'fallback' }} {{ 'x' and 'y' }} {{ not none }} {{ 0 and 1 / 0 }} {{ 1 or 1 / 0 }}", "fallback y True 0 1"},
      {"{{ 'yes' if 1 > 0 else 'no' }} [{{ 'never' if false }}] {{ 1 if 0 else 2 if 0 else 3 }}", "yes [] 3"},
      {"{{ -1|abs }} {{ 2 * 3 + 4 }} {{ 2 + 3 * 4 }} {{ 10 - 2 - 3 }} {{ 2 ~ 3 * 2 }} {{ -2 ** 2 }}", "1 10 14 5 26 4"},
      {"{{ 1 == true }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ (1, 2) == [1, 2] }}", "True True False"},
  });
}

TEST(JinjaSyntax, SlicesAndSubscripts) {
  expect_cases({
      {"{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'hello'[-3:] }} {{ 'abc'[-1] }} {{ 'abc'[10:] }}|", "el olleh llo c |"},
      {"{{ [1,2,3,4,5][::2] }} {{ [1,2,3,4,5][-2:] }} {{ [1,2,3][5:] }} {{ [1,2,3,4,5][4:0:-2] }} {{ [1,2,3][:-1] }}",
       "[1, 3, 5] [4, 5] [] [5, 3] [1, 2]"},
      {"{{ 'héllo'[1] }} {{ 'héllo'[:2] }} {{ '😀x'[1] }} {{ 'héllo'[::-1] }}", "é hé x olléh"},
      {"{{ messages[0]['role'] }} {{ messages[0].role }} {{ messages.1.content }} {{ messages[-1].role }}",
       "user user Yo assistant"},
      {"{{ {1: 'one'}[1.0] }} {{ {'items': 1}['items'] }} {{ {'a': {'b': 'deep'}}['a'].b }}", "one 1 deep"},
  });
}

TEST(JinjaSyntax, StringMethods) {
  expect_cases({
      {"{{ '  pad  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  l'.lstrip() }}|{{ 'r  '.rstrip() }}|{{ '\\nx\\n'.lstrip('\\n') }}",
       "pad|hi|l|r|x\n"},
      {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }}",
       "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c']"},
      {"{{ 'x</think>y'.split('</think>')[-1] }} {{ 'a\\nb\\r\\nc'.splitlines() }}", "y ['a', 'b', 'c']"},
      {"{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ \"they're bill's 2nd\".title() }} {{ 'hELLO wORLD'.capitalize() }}",
       "HELLO hello They'Re Bill'S 2Nd Hello world"},
      {"{{ 'aaa'.replace('a', 'b', 2) }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }}",
       "bba 2 3 -1 2"},
      {"{{ '-'.join(['a', 'b']) }} {{ 'x{}y{name}'.format(1, name='N') }} {{ '{:>4}|{:.2f}'.format('a', 3.14159) }}",
       "a-b x1yN    a|3.14"},
      {"{{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ ' '.isspace() }} {{ 'ABC'.isupper() }} {{ 'abc'.islower() }}",
       "True True True True True"},
      {"{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('lo', 'x')) }} {{ 'hi'.center(7, '*') }} {{ '42'.zfill(5) }}",
       "True True ***hi** 00042"},
      {"{{ '%s is %d, %.2f%%' % ('Ann', 30, 99.5) }} {{ '%-5s|%5s|' % ('a', 'b') }} {{ '%(x)s' % {'x': 1} }} {{ '%x %05d' % (255, 42) }}",
       "Ann is 30, 99.50% a    |    b| 1 ff 00042"},
  });
}

TEST(JinjaSyntax, DictAndListMethods) {
  expect_cases({
      {"{{ {'x': 1}.get('x') }} {{ {'x': 1}.get('y', 'd') }} {{ {'x': 1}.get('y') }} {{ {'x': 1}.keys()|list }} {{ {'x': 1}.values()|list }}",
       "1 d None ['x'] [1]"},
      {"{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;"},
      // Hugging Face's sandbox refuses list.append; kiln allows it, as llama.cpp does, since
      // templates written for llama.cpp build lists with it.
      {"{% set l = [1] %}{% set _ = l.append(2) %}{{ l }} {{ l.index(2) }} {{ l.count(1) }} {{ l.pop() }}{{ l }}",
       "[1, 2] 1 1 2[1]"},
      {"{% set ns = namespace(l=[]) %}{% for m in messages %}{% set _ = ns.l.append(m.role) %}{% endfor %}{{ ns.l }}",
       "['user', 'assistant']"},
      {"{{ dict(a=1, b=2) }} {{ dict({'a': 1}, b=2) }}", "{'a': 1, 'b': 2} {'a': 1, 'b': 2}"},
  });
}

TEST(JinjaFilters, TextFilters) {
  expect_cases({
      {"{{ '  t  '|trim }}|{{ 'xhix'|trim('x') }}|{{ 'up ü'|upper }} {{ 'LOW Ü'|lower }}", "t|hi|UP Ü low ü"},
      {"{{ 'hello world'|capitalize }} {{ 'hello big-world (x) 2nd'|title }}", "Hello world Hello Big-World (X) 2nd"},
      {"{{ 'a-b'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 1) }} {{ 42|string }} {{ none|string }}", "a+b baa 42 None"},
      {"{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<i>'|safe }}", "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt; &lt;b&gt; <i>"},
      {"{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('> ', blank=true) }}",
       "a\n  b\n\n  c|  a\n  b|a\n> \n> b"},
      {"{{ 'one two  three'|wordcount }} [{{ 'mid'|center(9) }}] {{ '%s-%s'|format('a', 'b') }} {{ '%(a)s'|format(a=1) }}",
       "3 [   mid   ] a-b 1"},
      {"{{ 'long sentence here'|truncate(9, leeway=0) }} {{ 'short'|truncate(10) }}", "long... short"},
      {"{{ 'héllo'|length }} {{ 'héllo'|count }} {{ 'abc'|reverse }} {{ 'ab'|list }} {{ 'abc'|first }} {{ 'abc'|last }}",
       "5 5 cba ['a', 'b'] a c"},
  });
}

TEST(JinjaFilters, SequenceFilters) {
  expect_cases({
      {"{{ [1, 2, 3]|length }} {{ {'a': 1}|count }} {{ [1, 2]|join(', ') }} {{ messages|join('|', attribute='role') }}",
       "3 1 1, 2 user|assistant"},
      {"{{ [3, 1, 2]|first }} {{ [3, 1, 2]|last }} {{ [1, 2, 3]|reverse|list }} {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ [1, 2, 3]|sum }}",
       "3 2 [3, 2, 1] 1 3 6"},
      {"{{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }}",
       "['A', 'b', 'c'] ['A', 'b', 'c'] [3, 2, 1]"},
      {"{{ [{'a': 2}, {'a': 1}]|sort(attribute='a') }} {{ messages|sort(attribute='role')|map(attribute='role')|list }}",
       "[{'a': 1}, {'a': 2}] ['assistant', 'user']"},
      {"{{ messages|map(attribute='role')|list }} {{ ['a', 'b']|map('upper')|list }} {{ messages|map(attribute='x', default='d')|list }}",
       "['user', 'assistant'] ['A', 'B'] ['d', 'd']"},
      {"{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 2, 3]|select('gt', 1)|list }}",
       "[1, 3] [2, 4] [1, 'a'] [2, 3]"},
      {"{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'eq', 'user')|map(attribute='content')|first }}",
       "1 Yo"},
      {"{{ [1, 2, 2, 'a', 'A']|unique|list }} {{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 0)|list }}",
       "[1, 2, 'a'] [[1, 2], [3, 4], [5]] [[1, 2], [3, 0]]"},
      {"{{ {'b': 1, 'a': 2}|items|list }} {{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }}",
       "[('b', 1), ('a', 2)] [('a', 2), ('b', 1)] [('a', 2), ('b', 1)]"},
      {"{{ [1, 2]|list }} {{ nothing|list }} {{ nothing|items|list }} {{ nothing|length }} {{ nothing|join }}|", "[1, 2] [] [] 0 |"},
  });
}

TEST(JinjaFilters, NumberFilters) {
  expect_cases({
      {"{{ '12'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ true|int }}", "13 3 7 3 26 1"},
      {"{{ '2.5'|float }} {{ 3|float }} {{ 'x'|float }} {{ 'x'|float(1.5) }}", "2.5 3.0 0.0 1.5"},
      {"{{ -3|abs }} {{ -3.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 3.14159|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 7|round }} {{ 15|round(-1) }}",
       "3 3.5 2.0 4.0 3.14 3.0 7 20"},
  });
}

TEST(JinjaFilters, DefaultFilter) {
  expect_cases({
      {"{{ nothing|default('dflt') }} {{ ''|default('empty', true) }} [{{ ''|d('kept') }}] {{ none|default('n') }} {{ 0|d(5, true) }}",
       "dflt empty [] None 5"},
  });
}

TEST(JinjaFilters, ToJsonLikePythonJsonDumps) {
  expect_cases({
      {"{{ {'a': [1, 2.5, none, true], 'ü': 'ç\"\\n\\t\\\\'}|tojson }}", "{\"a\": [1, 2.5, null, true], \"ü\": \"ç\\\"\\n\\t\\\\\"}"},
      {"{{ [1, {'x': []}, {}]|tojson(indent=2) }}", "[\n  1,\n  {\n    \"x\": []\n  },\n  {}\n]"},
      {"{{ {'b': 1, 'a': {'d': 1, 'c': 2}}|tojson(sort_keys=true) }}", "{\"a\": {\"c\": 2, \"d\": 1}, \"b\": 1}"},
      {"{{ {'emoji': '😀', 'é': 1}|tojson(ensure_ascii=true) }} {{ '请用李白'|tojson }}",
       "{\"emoji\": \"\\ud83d\\ude00\", \"\\u00e9\": 1} \"请用李白\""},
      {"{{ {'a': 1}|tojson(separators=(',', ':')) }} {{ {1: 2.0, none: true}|tojson }} {{ (1, 2)|tojson }} {{ '\\x01'|tojson }}",
       "{\"a\":1} {\"1\": 2.0, \"null\": true} [1, 2] \"\\u0001\""},
      {"{{ messages[0]|tojson }}", "{\"role\": \"user\", \"content\": \"Hi\"}"},
  });
  EXPECT_NE(error_of("{{ nothing|tojson }}").find("not JSON serializable"), std::string::npos);
}

TEST(JinjaTests, TypeAndValueTests) {
  expect_cases({
      {"{{ x is defined }} {{ messages is defined }} {{ x is undefined }} {{ x is not defined }} {{ none is none }} {{ 1 is not none }}",
       "False True True True True True"},
      {"{{ 'a' is string }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }}",
       "True True True True False True"},
      {"{{ {} is mapping }} {{ [] is mapping }} {{ [] is sequence }} {{ 'a' is iterable }} {{ 5 is iterable }} {{ true is boolean }}",
       "True False True True False True"},
      {"{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}", "True False True False"},
      {"{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}", "True True True False"},
      {"{{ 'a' is equalto 'a' }} {{ none is sameas none }} {{ [] is sameas [] }} {{ messages is sameas messages }}", "True True False True"},
      {"{{ 'A' is upper }} {{ 'a' is lower }} {{ 3 is gt 2 }} {{ 2 is in [1, 2] }} {{ range is callable }}", "True True True True True"},
      {"{{ messages[0].content is string and messages[0].role is not none }}", "True"},
  });
}

TEST(JinjaLoops, LoopVariables) {
  expect_cases({
      {"{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ loop.index0 }},{{ loop.revindex }},{{ loop.revindex0 }},"
       "{{ loop.first }},{{ loop.last }};{% endfor %}",
       "1/2:0,2,1,True,False;2/2:1,1,0,False,True;"},
      {"{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>"
       "{{ loop.nextitem.role if loop.nextitem is defined else '-' }} {% endfor %}",
       "->assistant user>- "},
      {"{% for i in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %} {% for x in [1, 1, 2] %}{{ loop.changed(x) }}{% endfor %}",
       "ababa TrueFalseTrue"},
      {"{% for i in range(3) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", "121;122;123;"},
  });
}

TEST(JinjaLoops, FiltersElseUnpackingAndControl) {
  expect_cases({
      {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", "01345"},
      {"{% for i in range(5) if i is odd %}{{ i }}{{ loop.length }}{% endfor %}", "1232"},
      {"{% for x in [] %}x{% else %}empty{% endfor %} {% for x in nothing %}x{% else %}undefined is empty{% endfor %}",
       "empty undefined is empty"},
      {"{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %} {% for (a, b) in ['xy'] %}{{ b }}{{ a }}{% endfor %}", "37 yx"},
      {"{{ range(2, 10, 3)|list }} {{ range(3, 0, -1)|list }} {% for c in 'héy' %}{{ c }}.{% endfor %} {% for k in {'p': 1, 'q': 2} %}{{ k }}{% endfor %}",
       "[2, 5, 8] [3, 2, 1] h.é.y. pq"},
      {"{% for m in messages[::-1] %}{{ m.role }} {% endfor %}", "assistant user "},
  });
}

TEST(JinjaScopes, SetNamespaceAndScoping) {
  expect_cases({
      // A set inside a loop stays in that iteration; inside an if it does not.
      {"{% set outer = 'o' %}{% for i in [1, 2] %}{{ outer }}{% set outer = 'in' ~ i %}{{ outer }}{% endfor %} {{ outer }}",
       "oin1oin2 o"},
      {"{% if true %}{% set leaked = 'yes' %}{% endif %}{{ leaked }} {% set a, b = 1, 2 %}{{ a }}{{ b }}", "yes 12"},
      {"{% set ns = namespace(count=0, s='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}"
       "{{ ns.count }} {{ ns.s }}",
       "2 ua"},
      {"{% set ns = namespace() %}{% set ns.x = [1] %}{{ ns.x }} {{ namespace({'b': 2}).b }}", "[1] 2"},
      {"{% set messages = messages[1:] %}{{ messages|length }} {% set add_generation_prompt = false %}{{ add_generation_prompt }}",
       "1 False"},
      {"{% set block %}  captured {{ 1 + 1 }}  {% endset %}[{{ block }}] {% set up | upper %}shout{% endset %}{{ up }}",
       "[  captured 2  ] SHOUT"},
      {"{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}", "3False"},
  });
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.y = 2 %}").find("non-namespace"), std::string::npos);
}

TEST(JinjaScopes, MacrosCallAndFilterBlocks) {
  expect_cases({
      {"{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}"
       "{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet('Cy', punct='?') }}",
       "Hello, Ann! Hi, Bob! Hello, Cy?"},
      {"{% macro fact(n) %}{{ 1 if n <= 1 else n * fact(n - 1)|int }}{% endmacro %}{{ fact(5) }}", "120"},
      {"{% macro m(a=1, b=a+1) %}{{ a }}{{ b }}{% endmacro %}{{ m() }} {{ m(5) }} {% macro n(x) %}[{{ x }}]{% endmacro %}{{ n() }}",
       "12 56 []"},
      {"{% macro va() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ va(1, 2, k=3) }}", "(1, 2){'k': 3}"},
      {"{% macro m() %}{{ late }}{% endmacro %}{% set late = 'seen' %}{{ m() }}", "seen"},
      {"{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %}", "<b>bold</b>"},
      {"{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}",
       "[1][2]"},
      {"{% filter upper %}quiet {{ 'words' }}{% endfilter %} {% filter replace('a', 'b')|upper %}aaa{% endfilter %}", "QUIET WORDS BBB"},
      {"{% raw %}{{ not rendered }} {% if %}{% endraw %}", "{{ not rendered }} {% if %}"},
      // transformers registers this tag to mark assistant tokens; the body renders as is.
      {"{% generation %}{{ 'gen' }}{% endgeneration %}", "gen"},
      {"{% set j = joiner(' | ') %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}", "1 | 2 | 3"},
  });
  EXPECT_NE(error_of("{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}").find("recursion"), std::string::npos);
  EXPECT_NE(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").find("takes not more than 1"), std::string::npos);
}

TEST(JinjaWhitespace, DashControlTrimAndLstripBlocks) {
  expect_cases({
      // trim_blocks: the newline after a block tag goes; lstrip_blocks: its indentation goes.
      {"a\n{% if true %}\nb\n{% endif %}\nc", "a\nb\nc"},
      {"a\n  {% if true %}\n  b\n  {% endif %}\nc", "a\n  b\nc"},
      {"{% for x in [1, 2] %}\n  {{ x }}\n{% endfor %}", "  1\n  2\n"},
      // Variable tags are neither trimmed nor lstripped.
      {"  {{ 'x' }}\n{{ 'y' }}", "  x\ny"},
      // "-" strips all whitespace on its side, newlines included.
      {"x{%- if true -%}\n\n  y  \n\n{%- endif -%}z", "xyz"},
      {"{{- 'a' -}}  \n  {{- 'b' -}}", "ab"},
      {"a  {%- if true %}\n  b\n  {%- endif %}\nc", "a  bc"},
      // "+" turns lstrip_blocks (before) and trim_blocks (after) off.
      {"   {%+ if true %}a{% endif +%}\nb", "   a\nb"},
      // Comments vanish, with the same whitespace rules as block tags.
      {"{# c #}\n  {# c #}  \nend {#- c -#} x", "  \nendx"},
      // Windows line ends are normalized and one trailing newline of the source is dropped.
      {"{% if true %}\r\nwin\r\n{% endif %}\r\n", "win\n"},
      {"text\n\n", "text\n"},
      {"\t{% if true %}tab{% endif %}", "tab"},
      {"x {% if true %}y{% endif %} z", "x y z"},
      {"{%- raw -%}   raw   {%- endraw -%}   x", "rawx"},
  });
}

TEST(JinjaUndefined, BehavesLikeJinja2DefaultUndefined) {
  expect_cases({
      {"[{{ nothing }}] [{{ messages[0].missing }}] {{ messages[0].missing is defined }} {{ nothing == nothing }} [{{ nothing ~ 'cat' }}]",
       "[] [] False True [cat]"},
      {"{{ 'x' in nothing }} {{ nothing|default(1) }} {{ [1][5] is defined }} {{ messages[0].content.content is defined }}",
       "False 1 False False"},
      {"{{ nothing|map('upper')|list }} {{ none|selectattr('a')|list }} {{ 0|reject|list }}", "[] [] []"},
      {"{% if nothing %}t{% else %}f{% endif %} {% if not messages[0].tool_calls %}none{% endif %}", "f none"},
  });
  EXPECT_NE(error_of("{{ nothing.attr }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ nothing + 1 }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ messages[0].nope.deeper }}").find("'dict object' has no attribute 'nope'"), std::string::npos);
  EXPECT_NE(error_of("{{ nothing() }}").find("is undefined"), std::string::npos);
}

TEST(JinjaUnicode, CodePointsNotBytes) {
  expect_cases({
      {"{{ '请用李白风格'|length }} {{ '请用李白风格'[2:4] }} {{ '床前AI明'[::-1] }} {{ '😀'|tojson }} {{ 'é'.upper() }}",
       "6 李白 明IA前床 \"😀\" É"},
      {"{{ 'x'.center(5, '·') }} {{ '%-4s|' % 'é' }} {{ '{:^5}'.format('é') }}", "··x·· é   |   é  "},
  });
}

// ---- errors ----

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\nb\n{% if x %}\nno end", "line 4: unexpected end of template, expected 'elif' or 'else' or 'endif'"},
      {"{% for x in y %}\n{% endif %}", "line 2: unknown tag 'endif', expected 'endfor' or 'else'"},
      {"line1\n{{ 1 + }}", "line 2: unexpected end of print statement"},
      {"{{ (1 }}", "line 1: unexpected '}', expected ')'"},
      {"\n\n{{ 'unterminated }}", "line 3: unterminated string literal"},
      {"{# never closed", "line 1: missing end of comment tag"},
      {"{% raw %}no end", "missing end of raw directive"},
      {"{% foo %}", "unknown tag 'foo'"},
      {"{% include 'x' %}", "'include' tag is not supported"},
      {"{{ x|nofilter }}", "no filter named 'nofilter'"},
      {"{{ x is notatest }}", "no test named 'notatest'"},
      {"{% break %}", "'break' outside of a for loop"},
      {"{{ @ }}", "unexpected char '@'"},
      {"{{ 'x' }", "unexpected '}'"},
      {"{{ 'x'", "unexpected end of template, expected '}}'"},
  };
  for (const auto& [source, fragment] : cases) {
    try {
      ChatTemplate t(source);
      ADD_FAILURE() << "no error for " << source;
    } catch (const kiln::TemplateError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << source << " -> " << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    }
  }
  // Unknown filters inside an if fail only when reached, as in Jinja2.
  EXPECT_EQ(R("{% if false %}{{ x|nofilter }}{% endif %}ok"), "ok");
}

TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\n\n{{ 1 / 0 }}", "line 3: division by zero"},
      {"{% for m in messages %}\n{{ m.role + 1 }}{% endfor %}", "line 2: can only concatenate str (not \"int\") to str"},
      {"{{ 1 < 'a' }}", "'<' not supported between instances of 'int' and 'str'"},
      {"{% for x in 5 %}{% endfor %}", "'int' object is not iterable"},
      {"{% for a, b in [1] %}{% endfor %}", "'int' object is not iterable"},
      {"{% for a, b in [(1, 2, 3)] %}{% endfor %}", "too many values to unpack"},
      {"{{ 'abc'() }}", "'str' object is not callable"},
      {"{{ (not x)[1:] }}", "'bool' object is not subscriptable"},
      {"{{ 2 ** 64 }}", "integer overflow"},
      {"{{ range(1000000)|length }}", "range too big"},
      {"{{ 'x' * 1000000000000 }}", "too large"},
      {"{{ '%d' % 'x' }}", "a real number is required"},
  };
  for (const auto& [source, fragment] : cases) {
    const std::string err = error_of(source);
    EXPECT_NE(err.find(fragment), std::string::npos) << source << " -> " << err;
  }
}

TEST(JinjaErrors, RaiseExceptionGivesExactlyItsMessage) {
  try {
    R("{% if messages[0].role == 'user' %}\n{{ raise_exception('System role not supported') }}{% endif %}");
    FAIL() << "no exception";
  } catch (const kiln::TemplateRaisedError& e) {
    EXPECT_STREQ(e.what(), "System role not supported");
  }
  // It is a kiln::Error but not a TemplateError: callers can tell the template's own
  // refusal from a broken template.
  EXPECT_THROW(R("{{ raise_exception('x') }}"), kiln::Error);
}

TEST(JinjaErrors, TruncatedAndMangledRealTemplatesNeverCrash) {
  std::vector<std::string> sources;
  for (const auto& dir : {shared_path("templates"), data_dir()})
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().extension() == ".jinja") sources.push_back(read_file(entry.path().string()));
  ASSERT_GE(sources.size(), 20u);
  std::mt19937 rng(1234);
  const std::string specials = "{}%#-+()[]'\"|.,:= \n";
  const Json& hello = conversations().at("tools");
  int parsed = 0, rendered = 0;
  for (const std::string& src : sources) {
    std::vector<std::string> variants;
    for (int i = 0; i < 120; ++i) variants.push_back(src.substr(0, rng() % (src.size() + 1)));
    for (int i = 0; i < 60; ++i) {
      std::string s = src;
      for (int k = 0; k < 3; ++k) s[rng() % s.size()] = specials[rng() % specials.size()];
      variants.push_back(s);
    }
    for (const std::string& v : variants) {
      try {
        const ChatTemplate t(v);
        ++parsed;
        t.render(hello.at("messages"), true, "<s>", "</s>", hello.at("context"));
        ++rendered;
      } catch (const kiln::Error&) {
        // Refusing is fine; crashing, hanging or throwing anything else is not.
      }
    }
  }
  EXPECT_GT(parsed, 100);
  EXPECT_GT(rendered, 50);
}

TEST(JinjaErrors, HostileTemplatesAreRefused) {
  EXPECT_THROW(ChatTemplate("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), kiln::TemplateError);
  EXPECT_THROW(ChatTemplate("{{ " + std::string(5000, '[') + " }}"), kiln::TemplateError);
  std::string nested;
  for (int i = 0; i < 500; ++i) nested += "{% if true %}";
  EXPECT_THROW(ChatTemplate(nested + "x"), kiln::TemplateError);
  EXPECT_THROW(R("{{ 'ab' * 100000000 }}"), kiln::TemplateError);
  // Python allows these cycles; kiln refuses them (they would never be freed).
  EXPECT_NE(error_of("{% set l = [1] %}{% set _ = l.append(l) %}").find("cannot contain itself"), std::string::npos);
  EXPECT_NE(error_of("{% set a = [] %}{% set b = [a] %}{% set _ = a.append(b) %}").find("cannot contain itself"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.me = [ns] %}").find("cannot contain itself"), std::string::npos);
  EXPECT_THROW(R("{% for i in range(40) %}{{ 'x' * 1000000 }}{% endfor %}"), kiln::TemplateError);  // 32 MiB of output
  EXPECT_THROW(R("{{ ([0] * 100000000)|length }}"), kiln::TemplateError);
  // Widths and precisions with more digits than 64 bits hold (found by fuzz_chat_template).
  EXPECT_NE(error_of("{{ '%33333333333333333333d' % 1 }}").find("format width too large"), std::string::npos);
  EXPECT_NE(error_of("{{ '%.33333333333333333333f' % 1.5 }}").find("format width too large"), std::string::npos);
  EXPECT_NE(error_of("{{ '{:33333333333333333333}'.format(1) }}").find("invalid format specifier"), std::string::npos);
  // Floats beyond int64 given to an integer conversion, and indices with more digits than
  // int64 holds: a TemplateError or a result, never undefined behaviour or a stray
  // std::out_of_range.
  EXPECT_NE(error_of("{{ '%d' % 1e300 }}").find("too large for an integer"), std::string::npos);
  EXPECT_NE(error_of("{{ '%i' % -1e19 }}").find("too large for an integer"), std::string::npos);
  EXPECT_EQ(R("{{ '%d' % -2.5 }}"), "-2");
  EXPECT_EQ(R("{{ [[1, 2]]|map(attribute='99999999999999999999')|list|length }}"), "1");
  EXPECT_NO_THROW(error_of("{{ '{0[99999999999999999999]}'.format([1]) }}"));
}

// ---- kiln template ----

namespace {

std::string kiln_template(const std::string& args) { return shell_quote(kiln_binary()) + " template " + args; }

std::string conversation_file(const std::string& conv) {
  const std::string path = temp_dir() + "/" + conv + ".json";
  if (!std::filesystem::exists(path)) write_file(path, conversations().at(conv).at("messages").dump());
  return path;
}

}  // namespace

TEST(TemplateCli, RendersAFileLikeJinja2) {
  const std::string name = "Qwen-Qwen3-0.6B";
  auto r = run_command(kiln_template("--chat-template-file " + shell_quote(template_path(name)) + " --messages " +
                                     shell_quote(conversation_file("libai")) +
                                     " --add-generation-prompt --bos-token '<BOS>' --eos-token '<EOS>'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_file(data_dir() + "/expected/" + name + ".libai.txt"));  // exactly: no added newline
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(TemplateCli, BuiltinTemplatesAndContext) {
  auto r = run_command(kiln_template("--chat-template chatml --messages " + shell_quote(conversation_file("hello")) +
                                     " --add-generation-prompt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_file(data_dir() + "/expected/builtin-chatml.hello.txt"));
  const std::string ctx = temp_dir() + "/ctx.json";
  write_file(ctx, conversations().at("tools").at("context").dump());
  r = run_command(kiln_template("--chat-template-file " + shell_quote(template_path("Qwen-Qwen2.5-7B-Instruct")) +
                                " --messages " + shell_quote(conversation_file("tools")) + " --context " + shell_quote(ctx)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_file(data_dir() + "/expected/Qwen-Qwen2.5-7B-Instruct.tools.txt"));
}

TEST(TemplateCli, ReadsTheTemplateAndTokensOfAGguf) {
  const std::string gguf = shared_path("vocab/ggml-vocab-phi-3.gguf");
  auto r = run_command(kiln_template(shell_quote(gguf) + " --messages " + shell_quote(conversation_file("hello")) +
                                     " --add-generation-prompt --bos-token '<BOS>' --eos-token '<EOS>'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_file(data_dir() + "/expected/gguf-phi-3.hello.txt"));
  // Without --bos-token/--eos-token the vocabulary's own tokens are used, also with
  // another template.
  r = run_command(kiln_template(shell_quote(gguf) + " --messages " + shell_quote(conversation_file("kvcache"))));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("<s><|user|>\n", 0), 0u) << r.out;
  const std::string tokens = temp_dir() + "/tokens.jinja";
  write_file(tokens, "{{ bos_token }}|{{ eos_token }}");
  r = run_command(kiln_template(shell_quote(gguf) + " --chat-template-file " + shell_quote(tokens) + " --messages " +
                                shell_quote(conversation_file("kvcache"))));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>|<|endoftext|>");
}

TEST(TemplateCli, GgufWithoutTemplateSuggestsABuiltin) {
  const std::string gguf = shared_path("vocab/ggml-vocab-llama-spm.gguf");
  auto r = run_command(kiln_template(shell_quote(gguf) + " --messages " + shell_quote(conversation_file("hello"))));
  expect_one_line_error(r, 1, "--chat-template chatml");
  // ... and the built-in one then works with the model's BOS.
  r = run_command(kiln_template(shell_quote(gguf) + " --chat-template llama2 --messages " + shell_quote(conversation_file("hello"))));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[INST] Hello! [/INST]");
}

TEST(TemplateCli, RaiseExceptionIsTheErrorLine) {
  auto r = run_command(kiln_template("--chat-template-file " + shell_quote(template_path("google-gemma-2-2b-it")) +
                                     " --messages " + shell_quote(conversation_file("libai"))));
  expect_one_line_error(r, 1, "System role not supported");
  EXPECT_EQ(trim(r.err), "kiln: error: System role not supported");
}

TEST(TemplateCli, BadInputsAreOneLineErrors) {
  const std::string dir = temp_dir();
  write_file(dir + "/object.json", R"({"role": "user"})");
  write_file(dir + "/norole.json", R"([{"content": "x"}])");
  write_file(dir + "/broken.json", "[{");
  write_file(dir + "/syntax.jinja", "line 1\n{% for m in messages %}\n{{ m.role }}");
  const std::string hello = shell_quote(conversation_file("hello"));
  expect_one_line_error(run_command(kiln_template("--chat-template chatml --messages " + dir + "/object.json")), 1,
                        "object.json: expected a JSON array");
  expect_one_line_error(run_command(kiln_template("--chat-template chatml --messages " + dir + "/norole.json")), 1,
                        "norole.json: message 0 has no string \"role\"");
  expect_one_line_error(run_command(kiln_template("--chat-template chatml --messages " + dir + "/broken.json")), 1,
                        "broken.json: not valid JSON at byte 3");
  expect_one_line_error(run_command(kiln_template("--chat-template chatml --messages " + dir + "/missing.json")), 1,
                        "missing.json");
  expect_one_line_error(run_command(kiln_template("--chat-template-file " + dir + "/syntax.jinja --messages " + hello)), 1,
                        "line 3: unexpected end of template");
  expect_one_line_error(run_command(kiln_template("--chat-template nope --messages " + hello)), 2, "unknown chat template 'nope'");
  expect_one_line_error(run_command(kiln_template("--messages " + hello)), 2, "--chat-template");
}
