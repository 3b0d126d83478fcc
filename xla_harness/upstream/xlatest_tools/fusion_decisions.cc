// xla-harness probe: for every HLO module file given, evaluate the generic
// InstructionFusion::ShouldFuseInPlaceOp on each candidate (producer, consumer)
// pair whose consumer has in-place input/output pairs, and print one line per
// pair: file, consumer, producer, allow|forbid. Linked once against the stock
// and once against the patched instruction_fusion.o, the two outputs differ
// exactly where the patch changes a fusion decision. A file that cannot be read
// or parsed is named on stderr ("unreadable|unparsable<TAB>file[<TAB>why]") and
// makes the exit status 2.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "xla/hlo/analysis/alias_info.h"
#include "xla/hlo/ir/hlo_computation.h"
#include "xla/hlo/ir/hlo_instruction.h"
#include "xla/hlo/ir/hlo_module.h"
#include "xla/hlo/parser/hlo_parser.h"
#include "xla/service/hlo_module_config.h"
#include "xla/service/instruction_fusion.h"

int main(int argc, char** argv) {
  xla::AliasInfo alias_info;
  int unreadable = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i]);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string text = buffer.str();
    if (!in || text.empty()) {
      std::cerr << "unreadable\t" << argv[i] << "\n";
      ++unreadable;
      continue;
    }
    absl::StatusOr<std::unique_ptr<xla::HloModule>> module =
        xla::ParseAndReturnUnverifiedModule(text, xla::HloModuleConfig());
    if (!module.ok()) {
      // The parser's message on one line: what construct it refused, and where.
      std::string why(module.status().message());
      for (char& c : why) {
        if (c == '\n' || c == '\t') c = ' ';
      }
      std::cerr << "unparsable\t" << argv[i] << "\t" << why << "\n";
      ++unreadable;
      continue;
    }
    for (xla::HloComputation* computation : (*module)->computations()) {
      if (computation->IsFusionComputation()) continue;
      for (xla::HloInstruction* consumer : computation->instructions()) {
        if (alias_info.GetInPlaceInputOutputPairs(consumer).empty()) continue;
        for (const xla::HloInstruction* producer : consumer->unique_operands()) {
          if (producer->opcode() == xla::HloOpcode::kParameter) continue;
          xla::FusionDecision decision =
              xla::InstructionFusion::ShouldFuseInPlaceOp(
                  producer, consumer, &alias_info, std::nullopt);
          std::cout << argv[i] << "\t" << consumer->name() << "\t"
                    << producer->name() << "\t"
                    << (decision.IsForbidden() ? "forbid" : "allow") << "\n";
        }
      }
    }
  }
  return unreadable == 0 ? 0 : 2;
}
