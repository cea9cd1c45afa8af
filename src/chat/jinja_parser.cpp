// Jinja2-subset lexer and parser (see jinja_parser.h). Grammar and precedence follow
// jinja2/parser.py: condexpr < or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary
// minus < postfix (.attr, [index], call) < filters and tests.
#include "chat/jinja_parser.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "chat/jinja_lexer.h"

namespace qevict::jinja {

Expr::~Expr() {
  std::vector<ExprPtr> pending;
  auto take = [&pending](Expr& e) {
    for (auto& a : e.args)
      if (a) pending.push_back(std::move(a));
    for (auto& kw : e.kwargs)
      if (kw.second) pending.push_back(std::move(kw.second));
  };
  take(*this);
  while (!pending.empty()) {
    ExprPtr e = std::move(pending.back());
    pending.pop_back();
    take(*e);  // e is freed at the end of this iteration, its children already moved out
  }
}

int expr_tree_depth(const Expr& root) {
  int deepest = 0;
  std::vector<std::pair<const Expr*, int>> stack = {{&root, 1}};
  while (!stack.empty()) {
    const auto [e, d] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, d);
    for (const auto& a : e->args)
      if (a) stack.push_back({a.get(), d + 1});
    for (const auto& kw : e->kwargs)
      if (kw.second) stack.push_back({kw.second.get(), d + 1});
  }
  return deepest;
}

namespace {

constexpr int kMaxDepth = 100;  // nesting of expressions or blocks

// Filters and tests are checked at parse time, as jinja2 does; functions and methods at
// render time (templates guard optional ones, e.g. `strftime_now is defined`), by
// jinja_builtins.
constexpr std::string_view kFilters[] = {
    "trim",   "length", "count", "upper",  "lower",  "capitalize", "default",    "d",
    "tojson", "string", "first", "last",   "join",   "replace",    "int",        "float",
    "abs",    "list",   "items", "select", "reject", "selectattr", "rejectattr", "map"};
constexpr std::string_view kTests[] = {"defined",     "undefined", "none",    "string",  "number",
                                       "integer",     "float",     "boolean", "mapping", "sequence",
                                       "iterable",    "true",      "false",   "even",    "odd",
                                       "divisibleby", "eq",        "equalto", "ne",      "in"};
// Tags of full Jinja2 that this subset does not implement: named in the error.
constexpr std::string_view kUnsupportedTags[] = {
    "macro", "call", "filter", "include",    "import", "from",    "extends",
    "block", "raw",  "with",   "autoescape", "do",     "endmacro"};

template <size_t N>
bool contains(const std::string_view (&a)[N], std::string_view s) {
  return std::find(std::begin(a), std::end(a), s) != std::end(a);
}

// Recursive descent over the segments. Methods return null/false after recording the first
// error in err_.
class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  Expected<Body> parse() {
    Body body;
    std::string stop;
    if (!parse_body(&body, {}, &stop)) return Status::error(err_);
    return body;
  }

 private:
  // --- tokens of the current tag ---------------------------------------------------------
  const Token& peek(size_t k = 0) const {
    const std::vector<Token>& t = *toks_;
    return t[std::min(ti_ + k, t.size() - 1)];
  }
  const Token& next() {
    const Token& t = peek();
    if (t.type != Token::Type::kEnd) ++ti_;
    return t;
  }
  bool is_op(std::string_view op, size_t k = 0) const {
    return peek(k).type == Token::Type::kOp && peek(k).text == op;
  }
  bool is_name(std::string_view n, size_t k = 0) const {
    return peek(k).type == Token::Type::kName && peek(k).text == n;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    ++ti_;
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    ++ti_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Token::Type::kEnd:
        return "end of tag";
      case Token::Type::kString:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }
  bool fail(Pos p, const std::string& msg) {
    if (err_.empty()) err_ = error_at(p, msg);
    return false;
  }
  std::nullptr_t fail_expr(Pos p, const std::string& msg) {
    fail(p, msg);
    return nullptr;
  }
  // A statement's expression: loops build chains (a.b.c..., a + b + ..., x|f|g...) without
  // the recursion guard, so the whole tree's depth is checked here (the fuzzer found a
  // 1,000-deep attribute chain that overflowed the interpreter's stack).
  ExprPtr checked(ExprPtr e) {
    if (e && expr_tree_depth(*e) > kMaxExprTreeDepth)
      return fail_expr(e->pos, "expression nested too deeply");
    return e;
  }
  bool expect_op(std::string_view op) {
    if (skip_op(op)) return true;
    return fail(peek().pos, "expected '" + std::string(op) + "', found " + describe(peek()));
  }
  bool expect_end() {
    if (peek().type == Token::Type::kEnd) return true;
    return fail(peek().pos, "expected end of tag, found " + describe(peek()));
  }

  class DepthGuard {
   public:
    explicit DepthGuard(int* d) : d_(d) { ++*d_; }
    ~DepthGuard() { --*d_; }
    bool too_deep() const { return *d_ > kMaxDepth; }

   private:
    int* d_;
  };

  static ExprPtr make(Expr::Kind k, Pos p, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = p;
    e->name = std::move(name);
    return e;
  }
  static ExprPtr binary(Expr::Kind k, Pos p, std::string op, ExprPtr a, ExprPtr b) {
    ExprPtr e = make(k, p, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // --- statements ------------------------------------------------------------------------

  // Parses segments into `body` until a {% tag %} whose keyword is in `stops` (left current,
  // with the token cursor after the keyword; its keyword in *stop) or the end (*stop empty).
  bool parse_body(Body* body, std::initializer_list<std::string_view> stops, std::string* stop) {
    DepthGuard guard(&depth_);
    if (guard.too_deep())
      return fail(si_ < segs_.size() ? segs_[si_].pos : Pos{}, "blocks nested too deeply");
    stop->clear();
    for (; si_ < segs_.size(); ++si_) {
      Segment& seg = segs_[si_];
      if (seg.type == Segment::Type::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->pos = seg.pos;
        s->text = std::move(seg.text);
        body->push_back(std::move(s));
        continue;
      }
      toks_ = &seg.tokens;
      ti_ = 0;
      if (seg.type == Segment::Type::kOutput) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->pos = seg.pos;
        if (peek().type == Token::Type::kEnd) return fail(seg.pos, "empty expression");
        s->expr = checked(parse_expr());
        if (!s->expr || !expect_end()) return false;
        body->push_back(std::move(s));
        continue;
      }
      const Token& kw = peek();
      if (kw.type != Token::Type::kName)
        return fail(kw.pos, "expected a tag name, found " + describe(kw));
      if (std::find(stops.begin(), stops.end(), kw.text) != stops.end()) {
        *stop = kw.text;
        next();
        return true;
      }
      StmtPtr s;
      if (!parse_statement(&s)) return false;
      body->push_back(std::move(s));
    }
    return true;
  }

  // The current segment is a statement tag that is not a terminator of an enclosing block.
  bool parse_statement(StmtPtr* out) {
    const Segment& seg = segs_[si_];
    const std::string kw = next().text;
    auto s = std::make_unique<Stmt>();
    s->pos = seg.pos;
    std::string stop;
    if (kw == "if") {
      s->kind = Stmt::Kind::kIf;
      for (;;) {
        ExprPtr c = checked(parse_or());  // as jinja2: no `x if y else z` in an if test
        if (!c || !expect_end()) return false;
        s->conds.push_back(std::move(c));
        s->bodies.emplace_back();
        ++si_;
        if (!parse_body(&s->bodies.back(), {"elif", "else", "endif"}, &stop)) return false;
        if (stop != "elif") break;
      }
      if (stop == "else") {
        if (!expect_end()) return false;
        ++si_;
        if (!parse_body(&s->else_body, {"endif"}, &stop)) return false;
      }
      if (stop.empty()) return fail(seg.pos, "unclosed 'if' (missing '{% endif %}')");
      if (!expect_end()) return false;
    } else if (kw == "for") {
      s->kind = Stmt::Kind::kFor;
      do {
        const Token& t = next();
        if (t.type != Token::Type::kName)
          return fail(t.pos, "expected a loop variable name, found " + describe(t));
        s->targets.push_back(t.text);
      } while (skip_op(","));
      if (!skip_name("in")) return fail(peek().pos, "expected 'in', found " + describe(peek()));
      s->expr = checked(parse_or());  // no conditional expression: a trailing `if` filters the loop
      if (!s->expr) return false;
      if (skip_name("if")) {
        s->cond = checked(parse_expr());
        if (!s->cond) return false;
      }
      if (is_name("recursive")) return fail(peek().pos, "recursive loops are not supported");
      if (!expect_end()) return false;
      s->bodies.emplace_back();
      ++si_;
      ++loop_depth_;
      const bool ok = parse_body(&s->bodies[0], {"else", "endfor"}, &stop);
      --loop_depth_;
      if (!ok) return false;
      if (stop == "else") {
        if (!expect_end()) return false;
        ++si_;
        if (!parse_body(&s->else_body, {"endfor"}, &stop)) return false;
      }
      if (stop.empty()) return fail(seg.pos, "unclosed 'for' (missing '{% endfor %}')");
      if (!expect_end()) return false;
    } else if (kw == "set") {
      s->kind = Stmt::Kind::kSet;
      const Token& t = next();
      if (t.type != Token::Type::kName)
        return fail(t.pos, "expected a variable name after 'set', found " + describe(t));
      s->targets.push_back(t.text);
      if (skip_op(".")) {
        const Token& a = next();
        if (a.type != Token::Type::kName)
          return fail(a.pos, "expected an attribute name, found " + describe(a));
        s->targets.push_back(a.text);
      }
      if (is_op(",")) return fail(peek().pos, "'set' with several targets is not supported");
      if (peek().type == Token::Type::kEnd)
        return fail(peek().pos, "block 'set' ({% set x %}...{% endset %}) is not supported");
      if (!expect_op("=")) return false;
      s->expr = checked(parse_expr());
      if (!s->expr || !expect_end()) return false;
    } else if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) return fail(seg.pos, "'" + kw + "' outside a for loop");
      s->kind = kw == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      if (!expect_end()) return false;
    } else if (kw == "generation") {  // Hugging Face's assistant-mask marker: renders its body
      s->kind = Stmt::Kind::kBlock;
      if (!expect_end()) return false;
      s->bodies.emplace_back();
      ++si_;
      if (!parse_body(&s->bodies[0], {"endgeneration"}, &stop)) return false;
      if (stop.empty()) return fail(seg.pos, "unclosed 'generation'");
      if (!expect_end()) return false;
    } else if (contains(kUnsupportedTags, kw)) {
      return fail(seg.pos, "unsupported tag '" + kw + "'");
    } else if (kw == "elif" || kw == "else" || kw == "endif" || kw == "endfor" || kw == "endset" ||
               kw == "endgeneration") {
      return fail(seg.pos, "unexpected '" + kw + "'");
    } else {
      return fail(seg.pos, "unknown tag '" + kw + "'");
    }
    *out = std::move(s);
    return true;
  }

  // --- expressions -------------------------------------------------------------------------

  ExprPtr parse_expr() {
    DepthGuard guard(&depth_);
    if (guard.too_deep()) return fail_expr(peek().pos, "expression nested too deeply");
    ExprPtr e = parse_or();
    while (e && is_name("if")) {
      const Pos p = next().pos;
      ExprPtr cond = parse_or();
      if (!cond) return nullptr;
      ExprPtr other;
      if (skip_name("else")) {
        other = parse_expr();
        if (!other) return nullptr;
      }
      ExprPtr c = make(Expr::Kind::kCond, p);
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (e && is_name("or")) {
      const Pos p = next().pos;
      ExprPtr r = parse_and();
      if (!r) return nullptr;
      e = binary(Expr::Kind::kOr, p, "or", std::move(e), std::move(r));
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (e && is_name("and")) {
      const Pos p = next().pos;
      ExprPtr r = parse_not();
      if (!r) return nullptr;
      e = binary(Expr::Kind::kAnd, p, "and", std::move(e), std::move(r));
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(&depth_);
      if (guard.too_deep()) return fail_expr(peek().pos, "expression nested too deeply");
      const Pos p = next().pos;
      ExprPtr a = parse_not();
      if (!a) return nullptr;
      ExprPtr e = make(Expr::Kind::kNot, p);
      e->args.push_back(std::move(a));
      return e;
    }
    return parse_compare();
  }

  // a OP b [OP c ...]: a chain compares neighbours, as Python (`a < b < c`).
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    if (!first) return nullptr;
    ExprPtr cmp;
    for (;;) {
      std::string op;
      const Pos p = peek().pos;
      if (peek().type == Token::Type::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else {
        return cmp ? std::move(cmp) : std::move(first);
      }
      ExprPtr r = parse_math1();
      if (!r) return nullptr;
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, p);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(r));
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (e && (is_op("+") || is_op("-"))) {
      const Token& t = next();
      ExprPtr r = parse_concat();
      if (!r) return nullptr;
      e = binary(Expr::Kind::kBinary, t.pos, t.text, std::move(e), std::move(r));
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (e && is_op("~")) {
      const Pos p = next().pos;
      ExprPtr r = parse_math2();
      if (!r) return nullptr;
      e = binary(Expr::Kind::kBinary, p, "~", std::move(e), std::move(r));
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (e && (is_op("*") || is_op("/") || is_op("//") || is_op("%"))) {
      const Token& t = next();
      ExprPtr r = parse_pow();
      if (!r) return nullptr;
      e = binary(Expr::Kind::kBinary, t.pos, t.text, std::move(e), std::move(r));
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (e && is_op("**")) {  // left-associative in jinja2
      const Pos p = next().pos;
      ExprPtr r = parse_unary(true);
      if (!r) return nullptr;
      e = binary(Expr::Kind::kBinary, p, "**", std::move(e), std::move(r));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(&depth_);
    if (guard.too_deep()) return fail_expr(peek().pos, "expression nested too deeply");
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      const bool neg = t.text == "-";
      const Pos p = t.pos;
      ExprPtr a = parse_unary(false);
      if (!a) return nullptr;
      if (neg) {
        e = make(Expr::Kind::kNeg, p);
        e->args.push_back(std::move(a));
      } else {
        e = std::move(a);
      }
    } else {
      e = parse_primary();
    }
    if (!e) return nullptr;
    e = parse_postfix(std::move(e));
    if (e && with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.type) {
      case Token::Type::kName: {
        next();
        if (t.text == "true" || t.text == "True") return literal(t.pos, Value::boolean(true));
        if (t.text == "false" || t.text == "False") return literal(t.pos, Value::boolean(false));
        if (t.text == "none" || t.text == "None") return literal(t.pos, Value::none());
        return make(Expr::Kind::kName, t.pos, t.text);
      }
      case Token::Type::kString: {
        const Pos p = t.pos;
        std::string s;
        while (peek().type == Token::Type::kString) s += next().text;  // 'a' 'b' == 'ab'
        return literal(p, Value::string(std::move(s)));
      }
      case Token::Type::kInt:
        next();
        return literal(t.pos, Value::integer(t.i));
      case Token::Type::kFloat:
        next();
        return literal(t.pos, Value::number(t.f));
      case Token::Type::kEnd:
        return fail_expr(t.pos, "expected an expression, found end of tag");
      case Token::Type::kOp:
        break;
    }
    const Pos p = t.pos;
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::Kind::kList, p, "tuple");
      ExprPtr e = parse_expr();
      if (!e) return nullptr;
      if (is_op(",")) {  // a tuple, represented as a list
        ExprPtr tup = make(Expr::Kind::kList, p, "tuple");
        tup->args.push_back(std::move(e));
        while (skip_op(",") && !is_op(")")) {
          ExprPtr item = parse_expr();
          if (!item) return nullptr;
          tup->args.push_back(std::move(item));
        }
        e = std::move(tup);
      }
      if (!expect_op(")")) return nullptr;
      return e;
    }
    if (skip_op("[")) {
      ExprPtr list = make(Expr::Kind::kList, p);
      while (!is_op("]")) {
        ExprPtr item = parse_expr();
        if (!item) return nullptr;
        list->args.push_back(std::move(item));
        if (!skip_op(",")) break;
      }
      if (!expect_op("]")) return nullptr;
      return list;
    }
    if (skip_op("{")) {
      ExprPtr dict = make(Expr::Kind::kDict, p);
      while (!is_op("}")) {
        ExprPtr key = parse_expr();
        if (!key || !expect_op(":")) return nullptr;
        ExprPtr val = parse_expr();
        if (!val) return nullptr;
        dict->args.push_back(std::move(key));
        dict->args.push_back(std::move(val));
        if (!skip_op(",")) break;
      }
      if (!expect_op("}")) return nullptr;
      return dict;
    }
    return fail_expr(p, "unexpected " + describe(t));
  }

  static ExprPtr literal(Pos p, Value v) {
    ExprPtr e = make(Expr::Kind::kLiteral, p);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const Pos p = peek().pos;
      if (skip_op(".")) {
        const Token& t = next();
        if (t.type != Token::Type::kName)
          return fail_expr(t.pos, "expected an attribute name after '.', found " + describe(t));
        if (is_op("(")) {  // methods are resolved at render time, on the receiver's type
          ExprPtr m = make(Expr::Kind::kMethod, t.pos, t.text);
          m->args.push_back(std::move(e));
          next();
          if (!parse_call_args(m.get())) return nullptr;
          e = std::move(m);
        } else {
          ExprPtr a = make(Expr::Kind::kAttr, t.pos, t.text);
          a->args.push_back(std::move(e));
          e = std::move(a);
        }
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), p);
        if (!e) return nullptr;
      } else if (is_op("(")) {
        if (e->kind != Expr::Kind::kName)
          return fail_expr(p, "only named functions and methods can be called");
        next();  // unknown functions fail at render time, as in jinja2 (templates guard
                 // optional ones such as strftime_now with `is defined`)
        ExprPtr c = make(Expr::Kind::kCall, e->pos, e->name);
        if (!parse_call_args(c.get())) return nullptr;
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // After '[': an index or a slice [start:stop:step].
  ExprPtr parse_subscript(ExprPtr obj, Pos p) {
    ExprPtr parts[3];
    int n_colons = 0;
    for (;;) {
      if (is_op(":")) {
        if (++n_colons > 2) return fail_expr(peek().pos, "too many ':' in slice");
        next();
        continue;
      }
      if (is_op("]")) break;
      if (parts[n_colons]) return fail_expr(peek().pos, "expected ':' or ']' in subscript");
      parts[n_colons] = parse_expr();
      if (!parts[n_colons]) return nullptr;
    }
    next();  // ']'
    if (n_colons == 0) {
      if (!parts[0]) return fail_expr(p, "empty subscript");
      ExprPtr e = make(Expr::Kind::kIndex, p);
      e->args.push_back(std::move(obj));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    ExprPtr e = make(Expr::Kind::kSlice, p);
    e->args.push_back(std::move(obj));
    for (auto& part : parts) e->args.push_back(std::move(part));
    return e;
  }

  // After '(': positional and keyword arguments up to ')'.
  bool parse_call_args(Expr* call) {
    while (!is_op(")")) {
      if (peek().type == Token::Type::kName && is_op("=", 1)) {
        const std::string name = next().text;
        next();
        ExprPtr v = parse_expr();
        if (!v) return false;
        call->kwargs.emplace_back(name, std::move(v));
      } else {
        if (!call->kwargs.empty())
          return fail(peek().pos, "positional argument after keyword argument");
        ExprPtr v = parse_expr();
        if (!v) return false;
        call->args.push_back(std::move(v));
      }
      if (!skip_op(",")) break;
    }
    return expect_op(")");
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      if (skip_op("|")) {
        const Token& t = next();
        if (t.type != Token::Type::kName)
          return fail_expr(t.pos, "expected a filter name after '|', found " + describe(t));
        if (!is_supported_filter(t.text))
          return fail_expr(t.pos, "unsupported filter '" + t.text + "'");
        ExprPtr f = make(Expr::Kind::kFilter, t.pos, t.text);
        f->args.push_back(std::move(e));
        if (skip_op("(") && !parse_call_args(f.get())) return nullptr;
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        const bool negated = skip_name("not");
        const Token& t = next();
        // `is none` / `is true`: the literal keywords double as test names.
        if (t.type != Token::Type::kName)
          return fail_expr(t.pos, "expected a test name after 'is', found " + describe(t));
        if (!is_supported_test(t.text))
          return fail_expr(t.pos, "unsupported test '" + t.text + "'");
        ExprPtr test = make(Expr::Kind::kTest, t.pos, t.text);
        test->negated = negated;
        test->args.push_back(std::move(e));
        if (skip_op("(")) {
          if (!parse_call_args(test.get())) return nullptr;
        } else if (starts_test_argument()) {  // jinja2: `x is divisibleby 3`, one argument
          ExprPtr arg = parse_primary();
          if (arg) arg = parse_postfix(std::move(arg));
          if (!arg) return nullptr;
          test->args.push_back(std::move(arg));
        }
        e = std::move(test);
      } else {
        return e;
      }
    }
  }

  // As jinja2's parse_test: a name (but not else/or/and), literal, '[' or '{' after a test name
  // is its single argument.
  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.type == Token::Type::kName) return t.text != "else" && t.text != "or" && t.text != "and";
    return t.type == Token::Type::kString || t.type == Token::Type::kInt ||
           t.type == Token::Type::kFloat || is_op("[") || is_op("{");
  }

  std::vector<Segment> segs_;
  size_t si_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  size_t ti_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::string err_;
};

}  // namespace

bool is_supported_filter(std::string_view name) { return contains(kFilters, name); }
bool is_supported_test(std::string_view name) { return contains(kTests, name); }

Expected<Body> parse_template(std::string_view source) {
  std::vector<Segment> segs;
  QEVICT_RETURN_IF_ERROR(lex_template(source, &segs));
  Parser parser(std::move(segs));
  return parser.parse();
}

}  // namespace qevict::jinja
