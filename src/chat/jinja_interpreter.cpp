// Evaluation of the Jinja2 subset: statements, scopes, and operators with Python semantics.
// Functions, methods, filters and tests are in jinja_builtins.cpp.
#include "chat/jinja_interpreter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/jinja_builtins.h"

namespace qevict::jinja {

namespace {

constexpr uint64_t kWorkPerElement = 64;  // work charged per list or dict element

#define QEVICT_JINJA_TRY(var, expr)        \
  auto var##_or = (expr);                  \
  if (!var##_or) return var##_or.status(); \
  Value var = std::move(*var##_or)

// "64 MiB" for whole MiB, else the byte count.
std::string size_text(uint64_t bytes) {
  if (bytes % (uint64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

std::string bracketed(const Value& idx) {
  std::string s = "[";  // appended: GCC 12 warns (-Wrestrict) on "lit" + temporary string
  s += idx.repr();
  s += ']';
  return s;
}

// Python's slice index normalization for a sequence of length n.
void slice_bounds(int64_t n, const Value* start, const Value* stop, int64_t step, int64_t* b,
                  int64_t* e) {
  auto clamp = [&](const Value* v, int64_t dflt, int64_t lo, int64_t hi) {
    if (!v || v->is_none()) return dflt;
    int64_t i = v->as_int();
    if (i < 0) i += n;
    return i < lo ? lo : i > hi ? hi : i;
  };
  if (step > 0) {
    *b = clamp(start, 0, 0, n);
    *e = clamp(stop, n, 0, n);
  } else {
    *b = clamp(start, n - 1, -1, n - 1);
    *e = clamp(stop, -1, -1, n - 1);
  }
}

class Interpreter {
 public:
  Interpreter(const ValueDict& globals, const RenderLimits& limits) : limits_(limits) {
    scopes_.emplace_back();
    for (const auto& [k, v] : globals.items) scopes_[0][k] = v;
  }

  Expected<std::string> run(const Body& body) {
    Flow flow = Flow::kNormal;
    QEVICT_RETURN_IF_ERROR(exec(body, &flow));
    return std::move(out_);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;

  static Status err(Pos p, const std::string& msg) { return Status::error(error_at(p, msg)); }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined(name);
  }

  Status emit(Pos p, const std::string& s) {
    if (out_.size() + s.size() > limits_.max_output)
      return err(p, "output exceeds " + size_text(limits_.max_output));
    out_ += s;
    return Status::ok();
  }

  // --- statements --------------------------------------------------------------------------

  Status exec(const Body& body, Flow* flow) {
    for (const StmtPtr& sp : body) {
      const Stmt& s = *sp;
      switch (s.kind) {
        case Stmt::Kind::kText:
          QEVICT_RETURN_IF_ERROR(emit(s.pos, s.text));
          break;
        case Stmt::Kind::kOutput: {
          QEVICT_JINJA_TRY(v, eval(*s.expr));
          QEVICT_RETURN_IF_ERROR(emit(s.pos, v.str()));
          break;
        }
        case Stmt::Kind::kIf: {
          bool taken = false;
          for (size_t i = 0; i < s.conds.size() && !taken; ++i) {
            QEVICT_JINJA_TRY(c, eval(*s.conds[i]));
            if (c.truthy()) {
              taken = true;
              QEVICT_RETURN_IF_ERROR(exec(s.bodies[i], flow));
            }
          }
          if (!taken) QEVICT_RETURN_IF_ERROR(exec(s.else_body, flow));
          break;
        }
        case Stmt::Kind::kFor:
          QEVICT_RETURN_IF_ERROR(exec_for(s));
          break;
        case Stmt::Kind::kSet: {
          QEVICT_JINJA_TRY(v, eval(*s.expr));
          if (s.targets.size() == 1) {
            scopes_.back()[s.targets[0]] = std::move(v);
          } else {
            Value ns = lookup(s.targets[0]);
            if (!ns.is_dict() || !ns.as_dict().is_namespace)
              return err(s.pos, "cannot assign attribute '" + s.targets[1] + "' of '" +
                                    s.targets[0] + "': not a namespace()");
            ns.dict_mut().set(s.targets[1], std::move(v));
          }
          break;
        }
        case Stmt::Kind::kBreak:
          *flow = Flow::kBreak;
          return Status::ok();
        case Stmt::Kind::kContinue:
          *flow = Flow::kContinue;
          return Status::ok();
        case Stmt::Kind::kBlock:
          QEVICT_RETURN_IF_ERROR(exec(s.bodies[0], flow));
          break;
      }
      if (*flow != Flow::kNormal) return Status::ok();  // unwind to the enclosing loop
    }
    return Status::ok();
  }

  Expected<ValueList> iterate_at(const Value& v, Pos p) const {
    auto items = iterate(v, limits_.max_list);
    if (!items) return err(p, items.error());
    return items;
  }

  Status bind_targets(const Stmt& s, const Value& item, Scope* scope) const {
    if (s.targets.size() == 1) {
      (*scope)[s.targets[0]] = item;
      return Status::ok();
    }
    if (!item.is_list() || item.as_list().size() != s.targets.size())
      return err(s.pos, "cannot unpack " + item.repr() + " into " +
                            std::to_string(s.targets.size()) + " loop variables");
    for (size_t k = 0; k < s.targets.size(); ++k) (*scope)[s.targets[k]] = item.as_list()[k];
    return Status::ok();
  }

  Status exec_for(const Stmt& s) {
    QEVICT_JINJA_TRY(seq, eval(*s.expr));
    auto items_or = iterate_at(seq, s.expr->pos);
    if (!items_or) return items_or.status();
    ValueList items = std::move(*items_or);
    if (s.cond) {  // {% for x in xs if cond %}: filter first, so that loop.length counts the kept
      ValueList kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        Status st = bind_targets(s, item, &scopes_.back());
        Expected<Value> c = st ? eval(*s.cond) : Expected<Value>(st);
        scopes_.pop_back();
        if (!c) return c.status();
        if (c->truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Flow flow = Flow::kNormal;
      return exec(s.else_body, &flow);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    // One loop object per loop, updated in place (as jinja2's LoopContext), and one scope
    // cleared per iteration: a body's `set` does not survive into the next iteration.
    Value loop = Value::dict(ValueDict{});
    ValueDict& lv = loop.dict_mut();
    const char* kFields[] = {"index", "index0", "revindex", "revindex0", "first",
                             "last",  "length", "previtem", "nextitem"};
    for (const char* f : kFields) lv.items.emplace_back(f, Value());
    scopes_.emplace_back();
    Status st;
    for (int64_t i = 0; i < n && st; ++i) {
      if (++iterations_ > limits_.max_iterations) {
        st = err(s.pos, "too many loop iterations (more than " +
                            std::to_string(limits_.max_iterations) + ")");
        break;
      }
      lv.items[0].second = Value::integer(i + 1);
      lv.items[1].second = Value::integer(i);
      lv.items[2].second = Value::integer(n - i);
      lv.items[3].second = Value::integer(n - i - 1);
      lv.items[4].second = Value::boolean(i == 0);
      lv.items[5].second = Value::boolean(i == n - 1);
      lv.items[6].second = Value::integer(n);
      lv.items[7].second = i > 0 ? items[i - 1] : Value::undefined("previtem");
      lv.items[8].second = i + 1 < n ? items[i + 1] : Value::undefined("nextitem");
      Scope& scope = scopes_.back();
      scope.clear();
      scope["loop"] = loop;
      st = bind_targets(s, items[i], &scope);
      Flow flow = Flow::kNormal;
      if (st) st = exec(s.bodies[0], &flow);
      if (flow == Flow::kBreak) break;
    }
    scopes_.pop_back();
    return st;
  }

  // --- expressions -------------------------------------------------------------------------

  Expected<Value> eval(const Expr& e) {
    Expected<Value> v = eval_node(e);
    if (v) {
      const Value& x = *v;
      work_ += x.is_string() ? x.as_string().size()
               : x.is_list() ? x.as_list().size() * kWorkPerElement
               : x.is_dict() ? x.as_dict().items.size() * kWorkPerElement
                             : 1;
      if (work_ > limits_.max_work)
        return err(e.pos, "the template does too much work (over " + size_text(limits_.max_work) +
                              " of values evaluated)");
    }
    return v;
  }

  Expected<Value> eval_node(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList: {
        ValueList items;
        for (const ExprPtr& a : e.args) {
          QEVICT_JINJA_TRY(v, eval(*a));
          items.push_back(std::move(v));
        }
        return e.name == "tuple" ? Value::tuple(std::move(items)) : Value::list(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          QEVICT_JINJA_TRY(k, eval(*e.args[i]));
          if (!k.is_string()) return err(e.args[i]->pos, "dict keys must be strings");
          QEVICT_JINJA_TRY(v, eval(*e.args[i + 1]));
          d.set(k.as_string(), std::move(v));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::kAttr: {
        QEVICT_JINJA_TRY(obj, eval(*e.args[0]));
        if (obj.is_undefined()) return err(e.pos, undefined_message(obj));
        if (obj.is_dict()) {
          const Value* v = obj.as_dict().find(e.name);
          return v ? *v : Value::undefined(e.name);
        }
        return Value::undefined(e.name);  // jinja2: a missing attribute is undefined
      }
      case Expr::Kind::kIndex: {
        QEVICT_JINJA_TRY(obj, eval(*e.args[0]));
        QEVICT_JINJA_TRY(idx, eval(*e.args[1]));
        return index(obj, idx, e.pos);
      }
      case Expr::Kind::kSlice:
        return slice(e);
      case Expr::Kind::kCall:
      case Expr::Kind::kMethod:
      case Expr::Kind::kFilter:
        return call_builtin(e);
      case Expr::Kind::kTest:
        return test(e);
      case Expr::Kind::kNot: {
        QEVICT_JINJA_TRY(v, eval(*e.args[0]));
        return Value::boolean(!v.truthy());
      }
      case Expr::Kind::kNeg: {
        QEVICT_JINJA_TRY(v, eval(*e.args[0]));
        if (v.is_undefined()) return err(e.pos, undefined_message(v));
        if (v.is_integral()) {
          if (v.as_int() == std::numeric_limits<int64_t>::min())
            return err(e.pos, "integer overflow");
          return Value::integer(-v.as_int());
        }
        if (v.is_number()) return Value::number(-v.as_double());
        return err(e.pos, cat("bad operand type for unary -: '", v.type_name(), "'"));
      }
      case Expr::Kind::kAnd: {
        QEVICT_JINJA_TRY(a, eval(*e.args[0]));
        if (!a.truthy()) return a;
        return eval(*e.args[1]);
      }
      case Expr::Kind::kOr: {
        QEVICT_JINJA_TRY(a, eval(*e.args[0]));
        if (a.truthy()) return a;
        return eval(*e.args[1]);
      }
      case Expr::Kind::kCond: {
        QEVICT_JINJA_TRY(c, eval(*e.args[1]));
        if (c.truthy()) return eval(*e.args[0]);
        if (e.args[2]) return eval(*e.args[2]);
        return Value::undefined("");
      }
      case Expr::Kind::kCompare: {  // a < b < c is (a < b) and (b < c), b evaluated once
        QEVICT_JINJA_TRY(left, eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          QEVICT_JINJA_TRY(right, eval(*e.args[i + 1]));
          QEVICT_JINJA_TRY(r, binary(e.ops[i], left, right, e.pos));
          if (!r.truthy()) return r;
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kBinary: {
        QEVICT_JINJA_TRY(a, eval(*e.args[0]));
        QEVICT_JINJA_TRY(b, eval(*e.args[1]));
        return binary(e.name, a, b, e.pos);
      }
    }
    return err(e.pos, "unknown expression");
  }

  Expected<Value> index(const Value& obj, const Value& idx, Pos p) const {
    if (obj.is_undefined()) return err(p, undefined_message(obj));
    if (obj.is_dict() && idx.is_string()) {
      const Value* v = obj.as_dict().find(idx.as_string());
      return v ? *v : Value::undefined(idx.as_string());
    }
    if ((obj.is_list() || obj.is_string()) && idx.is_integral()) {
      std::vector<uint32_t> off;
      if (obj.is_string()) off = utf8_offsets(obj.as_string());
      const int64_t n = static_cast<int64_t>(obj.is_list() ? obj.as_list().size() : off.size() - 1);
      int64_t i = idx.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(bracketed(idx));
      if (obj.is_list()) return obj.as_list()[static_cast<size_t>(i)];
      const auto k = static_cast<size_t>(i);
      return Value::string(obj.as_string().substr(off[k], off[k + 1] - off[k]));
    }
    return Value::undefined(bracketed(idx));  // jinja2: a failed lookup is undefined
  }

  Expected<Value> slice(const Expr& e) {
    QEVICT_JINJA_TRY(obj, eval(*e.args[0]));
    Value parts[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) {
        parts[k] = Value::none();
        continue;
      }
      QEVICT_JINJA_TRY(v, eval(*e.args[k + 1]));
      if (!v.is_none() && !v.is_integral())
        return err(e.args[k + 1]->pos, "slice indices must be integers or none");
      parts[k] = v;
    }
    if (obj.is_undefined()) return err(e.pos, undefined_message(obj));
    const int64_t step = parts[2].is_none() ? 1 : parts[2].as_int();
    if (step == 0) return err(e.pos, "slice step cannot be zero");
    std::vector<uint32_t> off;  // character offsets (see utf8_offsets)
    if (obj.is_string()) {
      off = utf8_offsets(obj.as_string());
    } else if (!obj.is_list()) {
      return err(e.pos, cat("'", obj.type_name(), "' object is not subscriptable"));
    }
    const int64_t n = static_cast<int64_t>(obj.is_list() ? obj.as_list().size() : off.size() - 1);
    int64_t b, end;
    slice_bounds(n, &parts[0], &parts[1], step, &b, &end);
    ValueList items;
    std::string s;
    for (int64_t i = b; step > 0 ? i < end : i > end;) {
      if (obj.is_list()) {
        items.push_back(obj.as_list()[static_cast<size_t>(i)]);
      } else {
        const auto k = static_cast<size_t>(i);
        s.append(obj.as_string(), off[k], off[k + 1] - off[k]);
      }
      if (__builtin_add_overflow(i, step, &i)) break;  // a huge step leaves the range
    }
    if (obj.is_string()) return Value::string(std::move(s));
    return obj.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }

  Expected<Value> binary(const std::string& op, const Value& a, const Value& b, Pos p) const {
    if (op == "==") return Value::boolean(values_equal(a, b));
    if (op == "!=") return Value::boolean(!values_equal(a, b));
    if (op == "~") return concat_strings(a.str(), b.str(), p);
    if (op == "in" || op == "notin") {
      QEVICT_JINJA_TRY(r, contains(b, a, p));
      return Value::boolean(r.as_bool() != (op == "notin"));
    }
    if (a.is_undefined()) return err(p, undefined_message(a));
    if (b.is_undefined()) return err(p, undefined_message(b));
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      auto r = value_compare(a, b, op);
      if (!r) return err(p, r.error());
      return Value::boolean(*r);
    }
    auto type_error = [&]() {
      return err(p, cat("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '",
                        b.type_name(), "'"));
    };
    if (a.is_number() && b.is_number()) return arithmetic(op, a, b, p);
    if (op == "+") {
      if (a.is_string() && b.is_string()) return concat_strings(a.as_string(), b.as_string(), p);
      if (a.is_list() && b.is_list()) {
        if (a.as_list().size() + b.as_list().size() > limits_.max_list)
          return err(p, "list concatenation result too large");
        ValueList out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        return Value::list(std::move(out));
      }
      return type_error();
    }
    if (op == "*" && (a.is_integral() || b.is_integral()) &&
        (a.is_string() || b.is_string() || a.is_list() || b.is_list())) {
      const Value& seq = a.is_integral() ? b : a;
      const int64_t times = a.is_integral() ? a.as_int() : b.as_int();
      const uint64_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
      const uint64_t n = times > 0 ? static_cast<uint64_t>(times) : 0;
      const uint64_t limit = seq.is_string() ? limits_.max_output : limits_.max_list;
      if (unit > 0 && n > limit / unit) return err(p, "repetition result too large");
      if (seq.is_string()) {
        const size_t total = static_cast<size_t>(n * unit);
        std::string out;
        out.reserve(total);
        if (total > 0) out = seq.as_string();
        while (out.size() < total) out.append(out, 0, std::min(out.size(), total - out.size()));
        return Value::string(std::move(out));
      }
      ValueList out;
      for (uint64_t i = 0; i < n && unit > 0; ++i)
        out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
      return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
    if (op == "%" && a.is_string())
      return err(p, "string formatting with '%' is not supported (use '~' or '+')");
    return type_error();
  }

  Expected<Value> concat_strings(const std::string& a, const std::string& b, Pos p) const {
    if (a.size() + b.size() > limits_.max_output)
      return err(p, "string concatenation result too large");
    return Value::string(a + b);
  }

  Expected<Value> arithmetic(const std::string& op, const Value& a, const Value& b, Pos p) const {
    const bool ints = a.is_integral() && b.is_integral();
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      if (op == "+" && !__builtin_add_overflow(x, y, &r)) return Value::integer(r);
      if (op == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::integer(r);
      if (op == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::integer(r);
      if (op == "//" || op == "%") {
        if (y == 0) return err(p, "integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) return err(p, "integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors toward negative infinity
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (op == "**" && y >= 0) {  // by squaring: O(log y) however large y is
        int64_t acc = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) return err(p, "integer overflow");
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) return err(p, "integer overflow");
        }
        return Value::integer(acc);
      }
      if (op == "+" || op == "-" || op == "*") return err(p, "integer overflow");
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::number(x + y);
    if (op == "-") return Value::number(x - y);
    if (op == "*") return Value::number(x * y);
    if (op == "/") {
      if (y == 0.0) return err(p, "division by zero");
      return Value::number(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0.0) return err(p, "float division or modulo by zero");
      double m = std::fmod(x, y);
      if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
      if (op == "%") return Value::number(m);
      return Value::number(std::round((x - m) / y));  // (x - m) is a multiple of y, as in CPython
    }
    if (op == "**") return Value::number(std::pow(x, y));
    return err(p, "unsupported operator " + op);
  }

  Expected<Value> contains(const Value& container, const Value& item, Pos p) const {
    switch (container.kind()) {
      case Value::Kind::kUndefined:
        return Value::boolean(false);
      case Value::Kind::kString:
        if (!item.is_string())
          return err(p,
                     cat("'in <string>' requires string as left operand, not ", item.type_name()));
        return Value::boolean(container.as_string().find(item.as_string()) != std::string::npos);
      case Value::Kind::kList:
        for (const Value& v : container.as_list())
          if (values_equal(v, item)) return Value::boolean(true);
        return Value::boolean(false);
      case Value::Kind::kDict:
        return Value::boolean(item.is_string() && container.as_dict().find(item.as_string()));
      default:
        return err(p, cat("argument of type '", container.type_name(), "' is not iterable"));
    }
  }

  // Evaluated arguments of a call-like node, from args[first] on.
  Expected<CallArgs> eval_args(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) {
      QEVICT_JINJA_TRY(v, eval(*e.args[i]));
      args.pos.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      QEVICT_JINJA_TRY(v, eval(*x));
      args.kw.emplace_back(k, std::move(v));
    }
    return args;
  }

  // kCall, kMethod, kFilter: evaluate the subject and the arguments, then the builtin.
  Expected<Value> call_builtin(const Expr& e) {
    Value subject;
    if (e.kind != Expr::Kind::kCall) {
      auto v = eval(*e.args[0]);
      if (!v) return v;
      subject = std::move(*v);
    }
    auto args = eval_args(e, e.kind == Expr::Kind::kCall ? 0 : 1);
    if (!args) return args.status();
    Expected<Value> r = e.kind == Expr::Kind::kCall ? call_function(e.name, *args, limits_)
                        : e.kind == Expr::Kind::kMethod
                            ? call_method(subject, e.name, *args, limits_)
                            : apply_filter(e.name, subject, *args, limits_);
    if (!r) return err(e.pos, r.error());
    return r;
  }

  Expected<Value> test(const Expr& e) {
    QEVICT_JINJA_TRY(v, eval(*e.args[0]));
    auto args = eval_args(e, 1);
    if (!args) return args.status();
    auto r = apply_test(e.name, v, *args);
    if (!r) return err(e.pos, r.error());
    return Value::boolean(*r != e.negated);
  }

  std::vector<Scope> scopes_;
  std::string out_;
  uint64_t iterations_ = 0;
  uint64_t work_ = 0;  // see RenderLimits::max_work
  const RenderLimits limits_;
};

#undef QEVICT_JINJA_TRY

}  // namespace

Expected<std::string> render_template(const Body& body, const ValueDict& globals,
                                      const RenderLimits& limits) {
  Interpreter interp(globals, limits);
  return interp.run(body);
}

}  // namespace qevict::jinja
