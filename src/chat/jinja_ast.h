// Syntax tree of the Jinja2 subset: expressions and statements, each with the source position
// that errors report. Built by jinja_parser, walked by jinja_interpreter.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace qevict::jinja {

struct Pos {
  int line = 1;
  int col = 1;
};

// "line L, col C: msg", the form of every parse and render error.
inline std::string error_at(Pos p, std::string_view msg) {
  return cat("line ", std::to_string(p.line), ", col ", std::to_string(p.col), ": ", msg);
}

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // args = items; name "tuple" for a tuple
    kDict,     // args = keys and values interleaved
    kAttr,     // args[0].name
    kIndex,    // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]], absent parts are null
    kCall,     // global function `name`(args, kwargs)
    kMethod,   // args[0].name(args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])
    kNot,      // not args[0]
    kNeg,      // -args[0]
    kBinary,   // args[0] op args[1]; op: + - * / // % ** ~
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...; ops: == != < <= > >= in notin
    kAnd,      // args[0] and args[1] (short-circuit)
    kOr,       // args[0] or args[1] (short-circuit)
    kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  Pos pos;
  std::string name;      // name / attribute / function / filter / test / operator
  Value value;           // kLiteral
  bool negated = false;  // kTest: `is not`
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare

  Expr() = default;
  Expr(const Expr&) = delete;
  Expr& operator=(const Expr&) = delete;
  // Frees the subtree without recursion: chains such as a.b.c... or 1+1+1... are built by
  // loops and can be as deep as the template is long (the parser rejects trees deeper than
  // kMaxExprTreeDepth, but it builds them first).
  ~Expr();
};

// Deepest expression tree a template may hold (the interpreter recurses once per level).
inline constexpr int kMaxExprTreeDepth = 128;
// The depth of e's tree (a leaf is 1), computed without recursion.
int expr_tree_depth(const Expr& e);

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // if conds[0] body[0] elif conds[1] body[1] ... else else_body
    kFor,       // for targets in expr [if cond] body [else else_body]
    kSet,       // set target = expr, or set target.attr = expr
    kBreak,     // {% break %}
    kContinue,  // {% continue %}
    kBlock,     // a body rendered as is ({% generation %})
  };
  Kind kind;
  Pos pos;
  std::string text;
  ExprPtr expr;                      // kOutput, kFor (iterable), kSet (value)
  ExprPtr cond;                      // kFor filter
  std::vector<ExprPtr> conds;        // kIf
  std::vector<Body> bodies;          // kIf: one per cond; kFor/kBlock: bodies[0]
  Body else_body;                    // kIf, kFor
  std::vector<std::string> targets;  // kFor loop variables; kSet: {name} or {name, attr}
};

}  // namespace qevict::jinja
