// The mesh panel of the Plan tab: the mesh toolbar (add, duplicate and remove nodes and devices, device type,
// links, zoom and fit: MeshCanvas::editActions()), the canvas, and the legend beside it (links, rank layout,
// each stage's colour and layers), where it never covers a tile.
//
// What always holds: the panel adds no state of its own; the toolbar holds the canvas' own actions and the
// legend shows MeshCanvas::legendHtml() after every legendChanged().
#pragma once

#include <QWidget>

class QLabel;
class QToolBar;

namespace ms {

class MeshCanvas;
class ProjectDocument;

class MeshPanel : public QWidget {
  Q_OBJECT
 public:
  explicit MeshPanel(ProjectDocument* doc, QWidget* parent = nullptr);
  MeshCanvas* canvas() const { return m_canvas; }
  QToolBar* toolBar() const { return m_toolBar; }
  QLabel* legend() const { return m_legend; }

 private:
  MeshCanvas* m_canvas;
  QToolBar* m_toolBar;
  QLabel* m_legend;
};

}  // namespace ms
