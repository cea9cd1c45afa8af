// Test helper: reads the small NumPy files of the faithfulness goldens (tests/golden/kivi,
// tests/golden/zipcache): C order, any shape, element type checked against the header's
// descr ('<f2' raw f16 bits, '|u1', '<i4', ...). A missing or malformed file is a test failure.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace qevict::test {

// The elements of `path`, whose header must name `descr`.
template <class T>
std::vector<T> load_npy(const std::string& path, const char* descr) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (all.size() < 10 || all.compare(0, 6, "\x93NUMPY") != 0) {
    ADD_FAILURE() << path << ": not a .npy file";
    return {};
  }
  const size_t hlen = size_t(uint8_t(all[8])) | size_t(uint8_t(all[9])) << 8;
  const std::string header = all.substr(10, hlen);
  EXPECT_NE(header.find(std::string("'descr': '") + descr + "'"), std::string::npos)
      << path << ": " << header;
  EXPECT_NE(header.find("'fortran_order': False"), std::string::npos) << header;
  const size_t off = 10 + hlen;
  std::vector<T> out((all.size() - off) / sizeof(T));
  std::memcpy(out.data(), all.data() + off, out.size() * sizeof(T));
  return out;
}

// The whole text of a small file (a golden's meta.json).
inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The integer after "key": in a flat JSON object.
inline int json_int(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  EXPECT_NE(at, std::string::npos) << key;
  if (at == std::string::npos) return 0;
  return std::stoi(json.substr(at + key.size() + 3));
}

}  // namespace qevict::test
