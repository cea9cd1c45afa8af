// Tree-walking interpreter for the Jinja2 subset (reference path; templates are tiny). Scoping
// follows jinja2: each for-loop iteration has its own scope, so `set` inside a loop does not
// leak out (templates use namespace() for that); if-blocks share the enclosing scope.
#pragma once

#include <string>

#include "chat/jinja_ast.h"
#include "chat/render_limits.h"
#include "core/status.h"

namespace qevict::jinja {

// Renders `body` with `globals` as the top-level variables. Errors read
// "line L, col C: what went wrong"; raise_exception(msg) gives "raise_exception: msg".
// `limits` bound its work (render_limits.h).
Expected<std::string> render_template(const Body& body, const ValueDict& globals,
                                      const RenderLimits& limits);

}  // namespace qevict::jinja
