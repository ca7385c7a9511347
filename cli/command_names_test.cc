#include "cli/command_names.h"

#include <gtest/gtest.h>

namespace gpufs {
namespace {

TEST(CommandNames, EditDistance) {
  EXPECT_EQ(EditDistance("pt", "put"), 1u);
  EXPECT_EQ(EditDistance("migrat", "migrate"), 1u);
  EXPECT_EQ(EditDistance("gte", "get"), 2u);
  EXPECT_EQ(EditDistance("", "ls"), 2u);
  EXPECT_EQ(EditDistance("mount", "mount"), 0u);
}

TEST(CommandNames, NearestIsATypoOrNothing) {
  std::vector<std::string> names = {"mount", "put", "get", "import", "ls", "stat", "rm", "migrate"};
  EXPECT_EQ(Nearest("pt", names), "put");
  EXPECT_EQ(Nearest("imp", names), "import");
  EXPECT_EQ(Nearest("stta", names), "stat");
  EXPECT_EQ(Nearest("frobnicate", names), std::nullopt);
}

TEST(CommandNames, UnknownCommandSkipsFlags) {
  CLI::App app;
  app.add_subcommand("put");
  app.add_subcommand("get");
  const char* typo[] = {"gpufs", "--force", "pt", "x"};
  EXPECT_EQ(UnknownCommand(app, 4, const_cast<char**>(typo)),
            "unknown command 'pt'; did you mean 'put'?");
  const char* good[] = {"gpufs", "--no-progress", "get", "x"};
  EXPECT_EQ(UnknownCommand(app, 4, const_cast<char**>(good)), std::nullopt);
  const char* none[] = {"gpufs", "--version"};
  EXPECT_EQ(UnknownCommand(app, 2, const_cast<char**>(none)), std::nullopt);
}

}  // namespace
}  // namespace gpufs
