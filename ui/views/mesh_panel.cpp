// MeshPanel; see mesh_panel.h.
#include "ui/views/mesh_panel.h"

#include <QHBoxLayout>
#include <QLabel>
#include <QScrollArea>
#include <QToolBar>
#include <QVBoxLayout>

#include "ui/views/mesh_canvas.h"

namespace ms {

namespace {
constexpr int kLegendWidth = 250;  // pixels: room for "stage 12: b60-b65 + b156-b161" at the UI font
}

MeshPanel::MeshPanel(ProjectDocument* doc, QWidget* parent)
    : QWidget(parent), m_canvas(new MeshCanvas(doc)), m_toolBar(new QToolBar), m_legend(new QLabel) {
  m_toolBar->setObjectName(QStringLiteral("meshToolBar"));
  m_toolBar->setToolButtonStyle(Qt::ToolButtonTextOnly);
  m_toolBar->setIconSize(QSize(16, 16));
  for (QAction* a : m_canvas->editActions()) m_toolBar->addAction(a);

  m_legend->setObjectName(QStringLiteral("meshLegend"));
  m_legend->setTextFormat(Qt::RichText);
  m_legend->setWordWrap(true);
  m_legend->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  m_legend->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_legend->setContentsMargins(6, 4, 6, 4);
  auto* legendScroll = new QScrollArea;
  legendScroll->setWidget(m_legend);
  legendScroll->setWidgetResizable(true);
  legendScroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  legendScroll->setFixedWidth(kLegendWidth);
  legendScroll->setFrameShape(QFrame::StyledPanel);

  auto* row = new QHBoxLayout;
  row->setContentsMargins(0, 0, 0, 0);
  row->setSpacing(4);
  row->addWidget(m_canvas, 1);
  row->addWidget(legendScroll);
  auto* column = new QVBoxLayout(this);
  column->setContentsMargins(0, 0, 0, 0);
  column->setSpacing(2);
  column->addWidget(m_toolBar);
  column->addLayout(row, 1);

  const auto update = [this] {
    m_legend->setText(m_canvas->legendHtml());
    m_legend->setToolTip(m_canvas->legendText());
  };
  connect(m_canvas, &MeshCanvas::legendChanged, this, update);
  update();
}

}  // namespace ms
