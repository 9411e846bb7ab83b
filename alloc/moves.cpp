#include "moves.hpp"

namespace uvm {

std::unique_lock<std::mutex> lock_moves() {
  static auto* moves = new std::mutex();  // never destroyed: frees may come from static destructors
  return std::unique_lock<std::mutex>(*moves);
}

}  // namespace uvm
